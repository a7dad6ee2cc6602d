"""JSON and JSON Lines: each record a section (and a chunk at least), its text from the
configured fields."""

from __future__ import annotations

import json
import re

from shared.errors import ParseError
from shared.parsing.document import ParsedDocument, ParseOptions, Section, decode_utf8


def parse_json(raw: bytes, options: ParseOptions) -> ParsedDocument:
    return _parse_json_records([_load_json(raw)], options.json_text_fields)


def parse_jsonl(raw: bytes, options: ParseOptions) -> ParsedDocument:
    return _parse_json_records(_load_jsonl(raw), options.json_text_fields)


def _load_json(raw: bytes) -> object:
    try:
        return _json_loads(decode_utf8(raw))
    except json.JSONDecodeError as e:
        raise ParseError(f"invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from e


# Records of a JSON Lines file or a top-level JSON array: each is a section (and a chunk at
# least), whatever its size.
MAX_JSON_RECORDS = 100_000
# Where a JSON Lines record ends, here and in intake's count of them (jsonl_line_count):
# "\n", "\r\n" or a lone "\r". Not str.splitlines' other separators (U+2028, U+0085...):
# those may sit inside a record's strings (a valid record cut in two), or stand in for line
# ends past intake's count.
_JSONL_LINE_END = re.compile(r"\r\n|\r|\n")
_JSONL_LINE_END_BYTES = re.compile(rb"\r\n|\r|\n")


def jsonl_line_count(raw: bytes) -> int:
    """The lines of a JSON Lines file, as the parser splits them (the last may lack an end)."""
    ends = len(_JSONL_LINE_END_BYTES.findall(raw))
    return ends + (not raw.endswith((b"\n", b"\r")))


def _load_jsonl(raw: bytes) -> list[object]:
    records = []
    for number, line in enumerate(_JSONL_LINE_END.split(decode_utf8(raw)), start=1):
        if not line.strip():
            continue
        try:
            records.append(_json_loads(line))
        except json.JSONDecodeError as e:
            raise ParseError(f"invalid JSON on line {number}: {e.msg}") from e
        except ParseError as e:
            raise ParseError(f"line {number}: {e.message}") from e
    return records


def _json_loads(text: str) -> object:
    """json.loads, with the two refusals it raises as other errors given as parse errors: a
    number of more digits than Python converts (4,300), and nesting deeper than the stack."""
    try:
        return json.loads(text)
    except RecursionError as e:
        raise ParseError("the JSON is nested too deeply") from e
    except ValueError as e:
        if isinstance(e, json.JSONDecodeError):
            raise
        raise ParseError(f"the JSON holds a value Python cannot read: {e}") from e


def _parse_json_records(records: list[object], text_fields: tuple[str, ...]) -> ParsedDocument:
    if len(records) == 1 and isinstance(records[0], list):
        records = list(records[0])
    if len(records) > MAX_JSON_RECORDS:
        raise ParseError(f"the JSON holds {len(records)} records; the limit is {MAX_JSON_RECORDS}")
    parts: list[str] = []
    sections: list[Section] = []
    offset = 0
    for number, record in enumerate(records, start=1):
        if isinstance(record, str):
            text = record
        elif isinstance(record, dict):
            text = "\n".join(str(record[f]) for f in text_fields if record.get(f))
        else:
            text = ""
        if not text.strip():
            continue
        label = record.get("title") if isinstance(record, dict) else None
        sections.append(Section(offset, str(label) if label else f"record {number}"))
        parts.append(text)
        offset += len(text) + 2
    if not parts:
        raise ParseError(f"no record has any of the text fields {list(text_fields)}")
    return ParsedDocument("\n\n".join(parts), sections)
