"""The one intake check every way in uses (JSON and multipart uploads, upload events): what
passes it is stored and gets a job; what fails it gets a 4xx (or, for an upload event, a dead
letter with the same reason) and is never stored.

Each bound is cheap to test, linear in the upload's size, and set so that what passes cannot
make the worker's work unbounded:

* size: ``CONCORD_MAX_UPLOAD_BYTES`` (413);
* names and metadata (:func:`check_upload_fields`, 400);
* content screening: binary formats, NUL bytes, XML entities, unreadable PDFs
  (shared/documents/screening.py, 415 or 422);
* JSON structure: numbers of at most ``MAX_JSON_NUMBER_CHARS`` characters, nesting at most
  ``MAX_JSON_DEPTH`` deep, JSON Lines of at most ``MAX_JSON_RECORDS`` records (422).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np

from shared.documents.schemas import (
    MAX_EXACT_INT,
    MAX_EXTERNAL_ID_CHARS,
    MAX_METADATA_BYTES,
    MAX_METADATA_KEYS,
    MAX_METADATA_LIST,
    MAX_TITLE_CHARS,
    Upload,
)
from shared.documents.screening import screen_upload
from shared.errors import InvalidRequest, ParseError, PayloadTooLarge
from shared.fields import ISO_DATE, METADATA_KEY, invisible_character, parse_iso_date
from shared.parsing import MAX_JSON_RECORDS, SUPPORTED_TYPES, jsonl_line_count
from shared.settings import Settings

MAX_JSON_DEPTH = 64
MAX_JSON_NUMBER_CHARS = 1000  # Python refuses integers of more than 4,300 digits

# A JSON string, escapes included; the unrolled form, linear and without backtracking. An
# unclosed string runs to the end: otherwise each failed match would restart at the next
# (escaped) quote and rescan the rest, quadratic on '"' followed by many '\\"'.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\Z)', re.DOTALL)
_LONG_NUMBER = re.compile(rb"[-+0-9.eE]{%d,}" % (MAX_JSON_NUMBER_CHARS + 1))
_BRACKETS = bytes(range(256)).translate(None, b"[]{}")  # every byte but the brackets
_DEPTH_STEP = np.zeros(256, dtype=np.int8)
_DEPTH_STEP[[ord("["), ord("{")]] = 1
_DEPTH_STEP[[ord("]"), ord("}")]] = -1


def check_upload(upload: Upload, settings: Settings) -> None:
    """Raise the ConcordError (with its 4xx status) of the first bound ``upload`` breaks."""
    if len(upload.raw) > settings.max_upload_bytes:
        raise PayloadTooLarge(
            f"the content is {len(upload.raw)} bytes; the limit is {settings.max_upload_bytes}"
        )
    check_upload_fields(upload.external_id, upload.title, upload.metadata or {})
    if upload.filename is not None:
        refuse_unstorable(upload.filename, "filename")
    screen_upload(upload.raw, upload.content_type, upload.filename)
    if SUPPORTED_TYPES.get(upload.content_type) in ("json", "jsonl"):
        check_json_structure(upload.raw, lines=SUPPORTED_TYPES[upload.content_type] == "jsonl")


def check_json_structure(raw: bytes, lines: bool) -> None:
    """Refuse JSON whose numbers, nesting or record count the parser would choke on, before
    it is stored (the worker refuses the same, later and at a cost)."""
    if lines:
        records = jsonl_line_count(raw)
        if records > MAX_JSON_RECORDS:
            raise ParseError(f"the file has {records} JSON lines; the limit is {MAX_JSON_RECORDS}")
    structure = _JSON_STRING.sub(b'""', raw)  # what strings hold is text, not structure
    if _LONG_NUMBER.search(structure):
        raise ParseError(f"the JSON holds a number longer than {MAX_JSON_NUMBER_CHARS} characters")
    brackets = structure.translate(None, _BRACKETS)
    if brackets:
        depth = int(np.cumsum(_DEPTH_STEP[np.frombuffer(brackets, dtype=np.uint8)]).max())
        if depth > MAX_JSON_DEPTH:
            raise ParseError(
                f"the JSON is nested {depth} levels deep; the limit is {MAX_JSON_DEPTH}"
            )


def check_upload_fields(external_id: str, title: str, metadata: dict[str, Any]) -> None:
    """Refuse an upload's names and metadata at the door, with the reason, whichever way it
    came in (JSON, multipart form or upload event; each has made sure there is an
    external_id)."""
    if len(external_id) > MAX_EXTERNAL_ID_CHARS:
        raise InvalidRequest(
            f"external_id is {len(external_id)} characters; the limit is {MAX_EXTERNAL_ID_CHARS}"
        )
    if len(title) > MAX_TITLE_CHARS:
        raise InvalidRequest(f"title is {len(title)} characters; the limit is {MAX_TITLE_CHARS}")
    refuse_unstorable(external_id, "external_id")
    refuse_unstorable(title, "title")
    for name, value in (("external_id", external_id), ("title", title)):
        found = invisible_character(value)
        if found:
            raise InvalidRequest(
                f"{name} must not contain control or format characters (found {found})"
            )
    refuse_unstorable(metadata, "metadata")
    check_metadata(metadata)


def check_metadata(metadata: dict[str, Any]) -> None:
    """A flat object: at most MAX_METADATA_KEYS keys named as filters name them, each value a
    string, number, boolean or null, or a list of those; a string that looks like a date must
    be a real one (it becomes a date range term). The error names the field at fault."""
    if len(metadata) > MAX_METADATA_KEYS:
        raise InvalidRequest(f"metadata has {len(metadata)} keys; the limit is {MAX_METADATA_KEYS}")
    for key, value in metadata.items():
        if not isinstance(key, str) or not METADATA_KEY.fullmatch(key):
            raise InvalidRequest(
                f"metadata key {key!r} is not allowed: 1-64 characters, letters, digits, "
                "'_', '-' and '.', not starting with '.' or '-'"
            )
        items = value if isinstance(value, list) else [value]
        if isinstance(value, list) and len(value) > MAX_METADATA_LIST:
            raise InvalidRequest(
                f"metadata.{key} holds {len(value)} values; the limit is {MAX_METADATA_LIST}"
            )
        for item in items:
            if item is not None and not isinstance(item, str | int | float | bool):
                raise InvalidRequest(
                    f"metadata.{key} must be a string, number, boolean or null, or a list of "
                    "those (metadata is a flat object)"
                )
            if isinstance(item, int) and not isinstance(item, bool) and abs(item) > MAX_EXACT_INT:
                raise InvalidRequest(
                    f"metadata.{key}: integers beyond ±2^53 are not kept exactly by both stores"
                )
            if isinstance(item, str) and ISO_DATE.match(item):
                try:
                    parse_iso_date(item)
                except ValueError as e:
                    raise InvalidRequest(
                        f"metadata.{key}: {item!r} is not a valid date ({e})"
                    ) from e
    size = len(json.dumps(metadata, separators=(",", ":"), ensure_ascii=False).encode())
    if size > MAX_METADATA_BYTES:
        raise InvalidRequest(
            f"metadata is {size} bytes as JSON; the limit is {MAX_METADATA_BYTES} (it is "
            "copied into every chunk)"
        )


def refuse_unstorable(value: Any, where: str) -> None:
    """Refuse at the door what Postgres would refuse at the insert: NUL characters and lone
    surrogates in text (text and JSONB), NaN and infinities in JSONB."""
    if isinstance(value, str):
        if "\x00" in value:
            raise InvalidRequest(f"{where} must not contain NUL characters")
        if not value.isascii() and not _encodes(value):
            raise InvalidRequest(f"{where} must be valid Unicode (it holds a lone surrogate)")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidRequest(f"{where} must not hold NaN or infinite numbers")
    elif isinstance(value, dict):
        for key, item in value.items():
            refuse_unstorable(key, where)
            refuse_unstorable(item, where)
    elif isinstance(value, list):
        for item in value:
            refuse_unstorable(item, where)


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
