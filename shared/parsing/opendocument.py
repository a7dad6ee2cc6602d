"""OpenDocument text (.odt), presentations (.odp) and spreadsheets (.ods): the archive's
``content.xml`` read with lxml (entities never resolved, no network).

odfpy, the library made for ODF, was tried first and left: it loads every part of the
archive, stops at the first it cannot parse and prints that whole part to standard output
(pandoc's ``styles.xml``, which repeats a namespace declaration, was one), and its last
release is from 2020. The text is all in ``content.xml``, in a handful of elements:

* text: headings (``text:h`` with their outline level), paragraphs, list items (as lines
  starting "- "), tables a row at a time under their header row; footnote bodies at the end,
  under "Footnotes";
* presentations: a section per slide (``draw:page``) headed by its title frame, its other
  frames' text and tables, then its speaker notes (``presentation:notes``) under "Speaker
  notes";
* spreadsheets: a section per sheet, as for Excel (shared/parsing/spreadsheets.py): the first
  row with text is the header, every cell by its value (``office:value``: the cached result of
  a formula), hidden sheets and rows without text left out, repeated empty rows never expanded.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from shared.errors import ParseError
from shared.parsing.containers import open_zip, read_member
from shared.parsing.document import PERMALINK_SIGNS, ParsedDocument, ParseOptions, TextBuilder
from shared.parsing.spreadsheets import MAX_ROWS, add_sheet

_NS = {
    "office": "urn:oasis:names:tc:opendocument:xmlns:office:1.0",
    "text": "urn:oasis:names:tc:opendocument:xmlns:text:1.0",
    "table": "urn:oasis:names:tc:opendocument:xmlns:table:1.0",
    "draw": "urn:oasis:names:tc:opendocument:xmlns:drawing:1.0",
    "presentation": "urn:oasis:names:tc:opendocument:xmlns:presentation:1.0",
    "style": "urn:oasis:names:tc:opendocument:xmlns:style:1.0",
    "xlink": "http://www.w3.org/1999/xlink",
}


def _q(name: str) -> str:
    prefix, local = name.split(":")
    return f"{{{_NS[prefix]}}}{local}"


H, P, LIST, LIST_ITEM = _q("text:h"), _q("text:p"), _q("text:list"), _q("text:list-item")
NOTE, LINK = _q("text:note"), _q("text:a")
BOOKMARK, BOOKMARK_START = _q("text:bookmark"), _q("text:bookmark-start")
NOTE_BODY, NOTE_CITATION = _q("text:note-body"), _q("text:note-citation")
TABLE, ROW, CELL = _q("table:table"), _q("table:table-row"), _q("table:table-cell")
COVERED = _q("table:covered-table-cell")
HEADER_ROWS, ROW_GROUP = _q("table:table-header-rows"), _q("table:table-rows")
PAGE, FRAME, NOTES = _q("draw:page"), _q("draw:frame"), _q("presentation:notes")
SPACE, TAB, LINE_BREAK = _q("text:s"), _q("text:tab"), _q("text:line-break")


def parse(raw: bytes, options: ParseOptions) -> ParsedDocument:
    root = _content(raw)
    body = root.find(_q("office:body"))
    if body is None or len(body) == 0:
        raise ParseError("the OpenDocument file has no body")
    body = body[0]
    kind = body.tag.split("}")[-1]
    out = TextBuilder(headings_in_text=kind != "spreadsheet")
    if kind == "presentation":
        _presentation(out, body)
    elif kind == "spreadsheet":
        _spreadsheet(out, body, _hidden_table_styles(root))
    else:
        notes: list[str] = []
        _text(out, body, notes)
        if notes:
            out.heading(1, "Footnotes")
            for note in notes:
                out.paragraph(note)
    return out.build()


def _content(raw: bytes) -> Any:
    from lxml import etree

    with open_zip(raw) as archive:
        try:
            content = read_member(archive, archive.getinfo("content.xml"))
        except KeyError as e:
            raise ParseError("the OpenDocument file has no content.xml") from e
    parser = etree.XMLParser(resolve_entities=False, no_network=True, huge_tree=False)
    try:
        root = etree.fromstring(content, parser)
    except etree.XMLSyntaxError as e:
        raise ParseError(f"the OpenDocument content is not valid XML ({e})") from e
    return root


def _hidden_table_styles(root: Any) -> set[str]:
    """The names of the table styles that hide a sheet (``table:display="false"``)."""
    hidden = set()
    for style in root.iter(_q("style:style")):
        properties = style.find(_q("style:table-properties"))
        if properties is not None and properties.get(_q("table:display")) == "false":
            hidden.add(style.get(_q("style:name")))
    return hidden


def _text(out: TextBuilder, element: Any, notes: list[str]) -> None:
    for child in element:
        if child.tag == H:
            level = _count(child.get(_q("text:outline-level")), 10)
            out.heading(level, _heading_text(child, notes))
        elif child.tag == P:
            out.paragraph(_inline(child, notes))
        elif child.tag == LIST:
            items = [_inline(p, notes) for item in child.iter(LIST_ITEM) for p in item.iter(P)]
            out.paragraph("\n".join(f"- {item}" for item in items if item))
        elif child.tag == TABLE:
            rows = [_cells(row, notes) for row in _rows(child)]
            if rows:
                out.table(rows[0], rows[1:])
        else:
            _text(out, child, notes)  # sections, frames and other containers


def _heading_text(heading: Any, notes: list[str]) -> str:
    """A heading's text without its permalink (a web page's "Error events#" made a file): a
    sign, last in the heading, linking within the document to the heading's own bookmark or
    to none (converters rename the bookmark and keep the page's anchor). A sign that links
    to another part of the document, or has text after it, is the heading's own."""
    text = _inline(heading, notes)
    own = {f"#{b.get(_q('text:name'))}" for b in heading.iter(BOOKMARK, BOOKMARK_START)}
    root = heading.getroottree().getroot()
    for link in heading.iter(LINK):
        href = link.get(_q("xlink:href")) or ""
        sign = "".join(link.itertext()).strip()
        after = (link.tail or "") + "".join(
            "".join(sibling.itertext()) + (sibling.tail or "") for sibling in link.itersiblings()
        )
        if (
            href.startswith("#")
            and (href in own or not _bookmarked(root, href[1:]))
            and sign in PERMALINK_SIGNS
            and not after.strip()
            and len(text) > len(sign)
            and text.endswith(sign)
        ):
            return text[: -len(sign)].rstrip()
    return text


def _bookmarked(root: Any, name: str) -> bool:
    return any(b.get(_q("text:name")) == name for b in root.iter(BOOKMARK, BOOKMARK_START))


def _inline(element: Any, notes: list[str]) -> str:
    """An element's text as a reader sees it: spaces and tabs as written (``text:s``,
    ``text:tab``), a footnote's body moved to ``notes`` and its mark left in place."""
    return " ".join(_raw_inline(element, notes).split())


def _raw_inline(element: Any, notes: list[str]) -> str:
    parts: list[str] = [element.text or ""]
    for child in element:
        if child.tag == NOTE:
            citation = child.find(NOTE_CITATION)
            body = child.find(NOTE_BODY)
            if body is not None:
                notes.append(" ".join(" ".join(p.itertext()) for p in body.iter(P)).strip())
            parts.append(citation.text or "" if citation is not None else "")
        elif child.tag == SPACE:
            parts.append(" " * _count(child.get(_q("text:c")), MAX_SPACES))
        elif child.tag in (TAB, LINE_BREAK):
            parts.append(" ")
        else:
            parts.append(_raw_inline(child, notes))
        parts.append(child.tail or "")
    return "".join(parts)


# Bounds of what a file's counts may make: columns of a row (a sheet's cell repeated 1,024
# times a cell made a 31 KB file 41 million characters) and spaces of one ``text:s``.
MAX_COLUMNS = 1024
MAX_SPACES = 100


def _count(value: str | None, most: int) -> int:
    """A repeat count as the file states it, within 1..``most`` (a count that is no number
    counts once)."""
    try:
        return max(1, min(int(value or 1), most))
    except ValueError:
        return 1


def _rows(table: Any) -> Iterator[Any]:
    for child in table:
        if child.tag == ROW:
            yield child
        elif child.tag in (HEADER_ROWS, ROW_GROUP):
            yield from _rows(child)


def _cells(row: Any, notes: list[str]) -> list[str]:
    cells: list[str] = []
    for cell in row:
        if cell.tag not in (CELL, COVERED):
            continue
        repeated = _count(cell.get(_q("table:number-columns-repeated")), MAX_COLUMNS)
        text = " ".join(_inline(p, notes) for p in cell.iter(P)).strip()
        if not text:
            text = cell.get(_q("office:value"), "") or ""
        cells.extend([text] * min(repeated, MAX_COLUMNS - len(cells)))
        if len(cells) >= MAX_COLUMNS:
            break
    while cells and not cells[-1]:
        cells.pop()
    return cells


def _presentation(out: TextBuilder, body: Any) -> None:
    for number, page in enumerate(body.iter(PAGE), start=1):
        frames = [frame for frame in page if frame.tag == FRAME]
        title = ""
        for frame in frames:
            if frame.get(_q("presentation:class")) == "title" or "Title" in (
                frame.get(_q("draw:name")) or ""
            ):
                title = " ".join(" ".join(frame.itertext()).split())
                frames.remove(frame)
                break
        out.heading(1, f"Slide {number}: {title}" if title else f"Slide {number}")
        notes: list[str] = []
        for frame in frames:
            _text(out, frame, notes)
        speaker = [
            " ".join(" ".join(p.itertext()).split())
            for notes_page in page.iter(NOTES)
            for p in notes_page.iter(P)
        ]
        speaker = [line for line in speaker if line]
        if speaker:
            out.heading(2, "Speaker notes")
            out.paragraph("\n".join(speaker))


def _spreadsheet(out: TextBuilder, body: Any, hidden_styles: set[str]) -> None:
    rows_read = 0
    for sheet in body.iter(TABLE):
        if sheet.get(_q("table:style-name")) in hidden_styles:
            continue  # a hidden sheet
        name = sheet.get(_q("table:name")) or ""
        rows = (_cells(row, []) for row in _rows(sheet))
        rows_read += add_sheet(out, name, rows, MAX_ROWS - rows_read)
