"""The formats Concord reads, one line each, and the two questions asked of them: what an upload
is (``resolve_content_type``: its bytes first, then what the client declared, then its file
name's extension), and what text it holds (``parse``).

Adding a format is a module with ``parse(raw, options) -> ParsedDocument`` and a line in
``FORMATS``; intake, sync, the upload route's errors and the metrics read this table."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

# The format modules by their own names (not through this package, which imports this).
import shared.parsing.containers as containers
import shared.parsing.epub as epub
import shared.parsing.html as html
import shared.parsing.json_records as json_records
import shared.parsing.mail as mail
import shared.parsing.markdown as markdown
import shared.parsing.ocr as ocr
import shared.parsing.opendocument as opendocument
import shared.parsing.pdf as pdf
import shared.parsing.rtf as rtf
import shared.parsing.slides as slides
import shared.parsing.spreadsheets as spreadsheets
import shared.parsing.text as text
import shared.parsing.word as word
from shared.errors import ParseError, UnsupportedMediaType
from shared.parsing.document import MAX_SECTION_CHARS, ParsedDocument, ParseOptions, Section
from shared.parsing.ocr import OcrUnavailable
from shared.retry import is_retriable
from shared.settings import Settings
from shared.text import storable_text

Parser = Callable[[bytes, ParseOptions], ParsedDocument]


@dataclass(frozen=True)
class Format:
    kind: str  # the short name metrics, errors and docs use
    content_types: tuple[str, ...]  # the first is the one Concord reports
    extensions: tuple[str, ...]
    parse: Parser
    # What the bytes are underneath: "zip" formats pass containers.check_zip at intake,
    # "image" ones Pillow's reading of their header, "ole" ones the reading of their streams
    # (shared/documents/screening.py).
    container: Literal["zip", "image", "ole"] | None = None


_OOXML = "application/vnd.openxmlformats-officedocument"
_ODF = "application/vnd.oasis.opendocument"

FORMATS: tuple[Format, ...] = (
    Format("text", ("text/plain",), (".txt", ".text"), text.parse),
    Format("markdown", ("text/markdown",), (".md", ".markdown"), markdown.parse),
    Format("html", ("text/html",), (".html", ".htm"), html.parse),
    Format("pdf", ("application/pdf",), (".pdf",), pdf.parse),
    Format("json", ("application/json",), (".json",), json_records.parse_json),
    Format(
        "jsonl",
        ("application/x-ndjson", "application/jsonl"),
        (".jsonl", ".ndjson"),
        json_records.parse_jsonl,
    ),
    Format("docx", (f"{_OOXML}.wordprocessingml.document",), (".docx", ".docm"), word.parse, "zip"),
    Format(
        "pptx", (f"{_OOXML}.presentationml.presentation",), (".pptx", ".pptm"), slides.parse, "zip"
    ),
    Format(
        "xlsx",
        (f"{_OOXML}.spreadsheetml.sheet",),
        (".xlsx", ".xlsm"),
        spreadsheets.parse_xlsx,
        "zip",
    ),
    Format("odt", (f"{_ODF}.text",), (".odt",), opendocument.parse, "zip"),
    Format("odp", (f"{_ODF}.presentation",), (".odp",), opendocument.parse, "zip"),
    Format("ods", (f"{_ODF}.spreadsheet",), (".ods",), opendocument.parse, "zip"),
    Format("epub", ("application/epub+zip",), (".epub",), epub.parse, "zip"),
    Format("rtf", ("application/rtf", "text/rtf"), (".rtf",), rtf.parse),
    Format("csv", ("text/csv",), (".csv",), spreadsheets.parse_csv),
    Format("tsv", ("text/tab-separated-values",), (".tsv", ".tab"), spreadsheets.parse_tsv),
    Format("eml", ("message/rfc822",), (".eml",), mail.parse_eml),
    Format("msg", (containers.OUTLOOK_MESSAGE,), (".msg",), mail.parse_msg, "ole"),
    Format(
        "image",
        ("image/png", "image/jpeg", "image/tiff"),
        (".png", ".jpg", ".jpeg", ".tif", ".tiff"),
        ocr.parse_image,
        "image",
    ),
)
# Formats told by their first bytes, whatever the upload says it is.
_SIGNATURES = (
    (b"%PDF-", "application/pdf"),
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"II*\x00", "image/tiff"),
    (b"MM\x00*", "image/tiff"),
)

BY_CONTENT_TYPE: dict[str, Format] = {ct: f for f in FORMATS for ct in f.content_types}
# content type -> kind, for everything that only needs to know which format it is
SUPPORTED_TYPES: dict[str, str] = {ct: f.kind for ct, f in BY_CONTENT_TYPE.items()}
EXTENSIONS: dict[str, str] = {ext: f.content_types[0] for f in FORMATS for ext in f.extensions}


# Declared types that say no more than "some text" or "some bytes".
_NOT_SAYING_MORE = ("", "application/octet-stream", "text/plain")


def supported_list() -> str:
    """The formats, as a person reads them in an error message."""
    return ", ".join(f.kind for f in FORMATS)


def resolve_content_type(declared: str | None, filename: str | None, raw: bytes) -> str:
    """The content type we will parse as: magic bytes first (PDF, RTF, images, and the
    members of a ZIP container), then a specific declared type, then the file extension; an
    Office file encrypted as a whole is refused here with what to do."""
    for signature, content_type in _SIGNATURES:
        if raw.startswith(signature):
            return content_type
    if raw.startswith(containers.ZIP_SIGNATURE):
        found = containers.zip_content_type(raw)
        if found is not None:
            return found
    elif raw.startswith(containers.OLE_SIGNATURE):
        found = containers.ole_content_type(raw)
        if found is not None:
            return found
    base = (declared or "").split(";")[0].strip().lower()
    if raw.startswith(b"{\\rtf") and base in _NOT_SAYING_MORE:
        return "application/rtf"  # RTF is text: a declared Markdown note may start so
    if base in SUPPORTED_TYPES:
        return base
    if filename:
        ext = "." + filename.rsplit(".", 1)[-1].lower() if "." in filename else ""
        if ext in EXTENSIONS:
            return EXTENSIONS[ext]
    if base in ("", "application/octet-stream"):
        return "text/plain"
    raise UnsupportedMediaType(
        f"content type {base!r} is not supported; Concord reads {supported_list()}"
    )


def parse(raw: bytes, content_type: str, options: ParseOptions | None = None) -> ParsedDocument:
    return parse_as(raw, content_type, options or ParseOptions())


def options_from(settings: Settings) -> ParseOptions:
    return ParseOptions(
        json_text_fields=settings.json_text_fields,
        ocr_max_pages=settings.ocr_max_pages,
        ocr_budget_s=settings.ocr_budget_s,
        pdf_text_timeout_s=settings.pdf_text_timeout_s,
        pdf_text_memory_mb=settings.pdf_text_memory_mb,
        pdf_text_max_chars=settings.pdf_text_max_chars,
    )


def parse_as(raw: bytes, content_type: str, options: ParseOptions) -> ParsedDocument:
    if not raw.strip():
        raise ParseError("the document is empty (0 bytes or only whitespace)")
    found = BY_CONTENT_TYPE.get(content_type)
    if found is None:
        raise ParseError(f"content type {content_type!r} is not supported")
    try:
        parsed = found.parse(raw, dataclasses.replace(options, parse_part=_parse_part))
    except (ParseError, OcrUnavailable, pdf.PdfiumUnavailable):  # the file's fault; the server's
        raise
    except Exception as e:
        if is_retriable(e):
            raise  # the task's time ran out, or the process's memory: not the file's fault
        # A library meeting what it cannot read raises what it raises (KeyError, ValueError,
        # an XML error, RecursionError on deep nesting): the file's fault, said as such.
        raise ParseError(
            f"the {found.kind} file could not be read ({type(e).__name__}: {e})"[:1000]
        ) from e
    if not parsed.text.strip():
        raise ParseError(f"no text could be extracted from this {found.kind} document")
    # Every chunk carries its section's path: capped for every kind (a JSON record's title
    # is a field of any length), or one upload's chunks would each repeat a megabyte.
    return ParsedDocument(
        storable_text(parsed.text),
        [
            Section(s.start, storable_text(s.path[:MAX_SECTION_CHARS]), s.flags)
            for s in parsed.sections
        ],
        parsed.notes,
    )


def _parse_part(name: str, declared: str, raw: bytes) -> ParsedDocument:
    """A part of a document (an e-mail's attachment) read as an upload of its own is: its
    type from its bytes first, an archive's checks in ``parse_as``; bytes that are no text
    fail to decode, and the caller lists the part by name instead. Parts are not OCR'd: a
    message of a hundred scans would pass every bound a document has."""
    content_type = resolve_content_type(declared, name, raw)
    if BY_CONTENT_TYPE[content_type].container == "zip":
        containers.check_zip(raw)  # what intake checks of an upload (parts never saw intake)
    return parse_as(raw, content_type, ParseOptions(ocr_max_pages=0))
