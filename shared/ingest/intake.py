"""The one intake check every way in uses (JSON and multipart uploads, upload events): what
passes it is stored and gets a job; what fails it gets a 4xx (or, for an upload event, a dead
letter with the same reason) and is never stored.

Each bound is cheap to test, linear in the upload's size, and set so that what passes cannot
make the worker's work unbounded:

* size: ``CONCORD_MAX_UPLOAD_BYTES`` (413);
* names and metadata (shared/ingest/service.check_upload_fields, 400);
* content screening: binary formats, NUL bytes, XML entities, unreadable PDFs
  (shared/ingest/screening.py, 415 or 422);
* JSON structure: numbers of at most ``MAX_JSON_NUMBER_CHARS`` characters, nesting at most
  ``MAX_JSON_DEPTH`` deep, JSON Lines of at most ``MAX_JSON_RECORDS`` records (422).
"""

from __future__ import annotations

import re

import numpy as np

from shared.errors import ParseError, PayloadTooLarge
from shared.ingest.parsing import SUPPORTED_TYPES
from shared.ingest.screening import screen_upload
from shared.ingest.service import Upload, check_upload_fields, refuse_unstorable
from shared.settings import Settings

MAX_JSON_DEPTH = 64
MAX_JSON_NUMBER_CHARS = 1000  # Python refuses integers of more than 4,300 digits
MAX_JSON_RECORDS = 100_000

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
        records = raw.count(b"\n") + (not raw.endswith(b"\n"))
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
