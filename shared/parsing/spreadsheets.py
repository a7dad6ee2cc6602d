"""Spreadsheets: Excel (.xlsx, read by openpyxl), CSV and TSV (the standard ``csv`` module).

A section per sheet, headed by the sheet's name; its first row with text is the header, and
every other row is kept whole on a line of its own under a path that ends with the header
(``TABLE``), so each chunk of a sheet says its columns and a row is never cut (rows are kept
as long as they are: padding them to the widest row made a 20 KB CSV 96 million characters).
Formulas are read by the values the file cached when it was last saved (what the author
saw); hidden and empty sheets, and rows without text, are left out. A workbook is read in
openpyxl's streaming mode, and past ``MAX_ROWS`` rows with text it is refused rather than
held in memory."""

from __future__ import annotations

import csv
import datetime as dt
import io
from collections.abc import Iterable, Iterator
from typing import Any

from shared.errors import ParseError
from shared.parsing.containers import without_macros
from shared.parsing.document import ParsedDocument, ParseOptions, TextBuilder, decode_utf8

# Rows with text, over every sheet of a file (a CSV export of a database is no document to
# retrieve passages from; it belongs in a database).
MAX_ROWS = 200_000
# What the CSV delimiter is told from (csv.Sniffer is quadratic in its sample: 64 KB of a
# hostile file took 23 s).
SNIFF_CHARS = 4096
# A field of a delimited file may be as long as an upload (csv's own limit is 128 KiB: a long
# cell of a real export was refused as "not valid CSV").
csv.field_size_limit(max(csv.field_size_limit(), 64 * 1024 * 1024))
# Rows without text in a row, after which a sheet's remaining rows are not read: a sheet
# formatted down to row 1,048,576 stores its empty rows, which streaming would walk one by one.
MAX_EMPTY_RUN = 10_000


def parse_xlsx(raw: bytes, options: ParseOptions) -> ParsedDocument:
    import openpyxl

    raw = without_macros(raw)  # checked (open_zip) before openpyxl inflates anything
    try:
        workbook = openpyxl.load_workbook(
            io.BytesIO(raw), read_only=True, data_only=True, keep_links=False
        )
    except Exception as e:  # openpyxl raises KeyError, InvalidFileException, lxml errors
        raise ParseError(f"the workbook could not be read ({type(e).__name__}: {e})") from e
    out = TextBuilder()
    rows_read = 0
    try:
        for sheet in workbook.worksheets:
            if sheet.sheet_state != "visible":
                continue
            sheet.reset_dimensions()  # the stated size may be a formatted million rows
            rows = _texts(sheet.iter_rows(values_only=True))
            rows_read += add_sheet(out, sheet.title, rows, MAX_ROWS - rows_read)
    finally:
        workbook.close()
    return out.build()


def parse_csv(raw: bytes, options: ParseOptions) -> ParsedDocument:
    return _delimited(raw, None)


def parse_tsv(raw: bytes, options: ParseOptions) -> ParsedDocument:
    return _delimited(raw, "\t")


def _delimited(raw: bytes, delimiter: str | None) -> ParsedDocument:
    text = decode_utf8(raw)
    if delimiter is None:
        try:  # on its first lines: the sniffer's time grows with the square of its sample
            delimiter = csv.Sniffer().sniff(text[:SNIFF_CHARS], delimiters=",;\t|").delimiter
        except csv.Error:
            delimiter = ","
    try:
        reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
        out = TextBuilder()
        add_sheet(out, "", ([cell.strip() for cell in row] for row in reader), MAX_ROWS)
    except csv.Error as e:
        raise ParseError(f"the file is not valid CSV (line {reader.line_num}: {e})") from e
    return out.build()


def add_sheet(out: TextBuilder, title: str, rows: Iterable[list[str]], room: int) -> int:
    """Add one sheet (header and rows) to ``out``; the number of rows with text it had."""
    kept: list[list[str]] = []
    for row in _until_long_empty_run(rows):
        if len(kept) > room:
            raise ParseError(f"the file has more than {MAX_ROWS} rows with text, the limit")
        kept.append(row)
    if not kept:
        return 0  # an empty sheet
    if title:
        out.heading(1, title)
    out.table(kept[0], kept[1:])
    return len(kept)


def _until_long_empty_run(rows: Iterable[list[str]]) -> Iterator[list[str]]:
    """The rows with text, trailing empty cells dropped, until ``MAX_EMPTY_RUN`` rows in a row
    have none."""
    empty = 0
    for row in rows:
        while row and not row[-1]:
            row = row[:-1]
        if not row:
            empty += 1
            if empty >= MAX_EMPTY_RUN:
                return
            continue
        empty = 0
        yield row


def _texts(rows: Iterable[tuple[Any, ...]]) -> Iterator[list[str]]:
    for row in rows:
        yield [_cell_text(value) for value in row]


def _cell_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))  # 1811.0 is how a sheet stores 1811
    if isinstance(value, dt.datetime) and value.time() == dt.time():
        return value.date().isoformat()
    if isinstance(value, dt.date | dt.datetime | dt.time):
        return value.isoformat()
    return " ".join(str(value).split())
