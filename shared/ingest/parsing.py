"""Turn an upload's bytes into text plus the section (heading path) of every span of it.

A parse failure raises ``ParseError`` with a reason a person can act on; retrying won't help.
"""

from __future__ import annotations

import bisect
import io
import json
import re
from dataclasses import dataclass, field
from typing import Any

from shared.errors import ParseError, UnsupportedMediaType
from shared.retry import is_retriable
from shared.text import storable_text

SUPPORTED_TYPES = {
    "text/plain": "text",
    "text/markdown": "markdown",
    "text/html": "html",
    "application/pdf": "pdf",
    "application/json": "json",
    "application/x-ndjson": "jsonl",
    "application/jsonl": "jsonl",
}
EXTENSIONS = {
    ".txt": "text/plain",
    ".text": "text/plain",
    ".md": "text/markdown",
    ".markdown": "text/markdown",
    ".html": "text/html",
    ".htm": "text/html",
    ".pdf": "application/pdf",
    ".json": "application/json",
    ".jsonl": "application/x-ndjson",
    ".ndjson": "application/x-ndjson",
}


# A page whose text layer holds fewer letters and digits than this (a scan with a page
# number, a figure with a caption) or is mostly not letters (a font without a usable encoding
# extracts as symbols) is text to check before use: its chunks carry this flag.
DOUBTFUL_EXTRACTION = "doubtful_extraction"
THIN_PAGE_CHARS = 100
MIN_LETTER_SHARE = 0.5


@dataclass
class Section:
    start: int
    path: str
    flags: tuple[str, ...] = ()


@dataclass
class ParsedDocument:
    text: str
    # Sorted by start; each applies from its start until the next one.
    sections: list[Section] = field(default_factory=list)

    def section_at(self, offset: int) -> str:
        """The section in force at ``offset``: a bisection, so chunking a document costs
        O(chunks x log sections), not O(chunks x sections)."""
        section = self._section_at(offset)
        return section.path if section else ""

    def flags_at(self, offset: int) -> tuple[str, ...]:
        """What parsing noticed about the text at ``offset`` (e.g. a doubtful extraction)."""
        section = self._section_at(offset)
        return section.flags if section else ()

    def _section_at(self, offset: int) -> Section | None:
        if len(self._starts) != len(self.sections):
            self._starts = [s.start for s in self.sections]
        i = bisect.bisect_right(self._starts, offset)
        return self.sections[i - 1] if i else None

    _starts: list[int] = field(default_factory=list, init=False, repr=False, compare=False)


def resolve_content_type(declared: str | None, filename: str | None, raw: bytes) -> str:
    """The content type we will parse as: magic bytes first, then a specific declared type,
    then the file extension."""
    if raw.startswith(b"%PDF-"):
        return "application/pdf"
    base = (declared or "").split(";")[0].strip().lower()
    if base in SUPPORTED_TYPES:
        return base
    if filename:
        ext = "." + filename.rsplit(".", 1)[-1].lower() if "." in filename else ""
        if ext in EXTENSIONS:
            return EXTENSIONS[ext]
    if base in ("", "application/octet-stream"):
        return "text/plain"
    raise UnsupportedMediaType(
        f"content type {base!r} is not supported; send one of {sorted(SUPPORTED_TYPES)}"
    )


def parse(
    raw: bytes,
    content_type: str,
    json_text_fields: tuple[str, ...] = ("text", "body", "content", "abstract"),
) -> ParsedDocument:
    if not raw.strip():
        raise ParseError("the document is empty (0 bytes or only whitespace)")
    kind = SUPPORTED_TYPES.get(content_type)
    if kind is None:
        raise ParseError(f"content type {content_type!r} is not supported")
    parsed = {
        "text": lambda: ParsedDocument(_decode(raw)),
        "markdown": lambda: _parse_markdown(_decode(raw)),
        "html": lambda: _parse_html(_decode(raw)),
        "pdf": lambda: _parse_pdf(raw),
        "json": lambda: _parse_json_records([_load_json(raw)], json_text_fields),
        "jsonl": lambda: _parse_json_records(_load_jsonl(raw), json_text_fields),
    }[kind]()
    if not parsed.text.strip():
        raise ParseError(f"no text could be extracted from this {kind} document")
    # Every chunk carries its section's path: capped for every kind (a JSON record's title
    # is a field of any length), or one upload's chunks would each repeat a megabyte.
    return ParsedDocument(
        storable_text(parsed.text),
        [
            Section(s.start, storable_text(s.path[:MAX_SECTION_CHARS]), s.flags)
            for s in parsed.sections
        ],
    )


def _decode(raw: bytes) -> str:
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ParseError(
            f"the document is not valid UTF-8 (byte {e.start}: {raw[e.start : e.start + 1]!r}); "
            "re-encode it as UTF-8"
        ) from e


# Linear: no lazy group followed by a greedy one that can rescan the rest of the line (the
# former ``(.+?)[ \t#]*$`` was quadratic on a long heading line); the closing #s are stripped
# in Python.
_HEADING = re.compile(r"(#{1,6})[ \t]+([^\n]*)")  # an ATX heading line (matched per line)
_FENCES = ("```", "~~~")
MAX_SECTION_CHARS = 500  # of a heading path kept with each chunk


def _parse_markdown(text: str) -> ParsedDocument:
    """Heading lines go to the section path, not into the text (a chunk's text never starts
    with ``## ``); a ``#`` line inside a fenced code block is code, not a heading. One pass
    over the lines: linear in the input whatever its lines hold."""
    sections: list[Section] = []
    path: list[str] = []
    kept: list[str] = []
    titles: list[str] = []
    offset = 0
    fence: str | None = None
    for line in text.splitlines(keepends=True):
        marker = line.lstrip(" ")[:3]
        if marker in _FENCES:
            fence = None if fence == marker else (fence or marker)
        elif fence is None and (match := _HEADING.match(line)):
            title = match.group(2).rstrip(" \t#\r").strip()
            if title:
                level = len(match.group(1))
                path = [*path[: level - 1], title[:MAX_SECTION_CHARS].rstrip()]
                sections.append(Section(offset, " > ".join(path)[-MAX_SECTION_CHARS:]))
                titles.append(title)
                continue
        kept.append(line)
        offset += len(line)
    body = "".join(kept)
    if not body.strip() and titles:  # headings only: their words are the text
        return ParsedDocument("\n\n".join(titles))
    return ParsedDocument(body, sections)


_BOILERPLATE_TAGS = (
    "script",
    "style",
    "noscript",
    "nav",
    "header",
    "footer",
    "aside",
    "form",
    "template",
    "svg",
    "iframe",
)
_BLOCK_TAGS = ("p", "li", "pre", "blockquote", "td", "th", "dd", "dt", "figcaption", "div")


def _parse_html(html: str) -> ParsedDocument:
    from bs4 import BeautifulSoup, Tag

    soup = BeautifulSoup(html, "html.parser")
    for tag in soup(list(_BOILERPLATE_TAGS)):
        tag.decompose()
    body = soup.find("main") or soup.find("article") or soup.body or soup
    parts: list[str] = []
    sections: list[Section] = []
    path: list[str] = []
    offset = 0
    for element in body.find_all(["h1", "h2", "h3", "h4", "h5", "h6", "tr", *_BLOCK_TAGS]):
        if not isinstance(element, Tag):
            continue
        if element.name == "tr":
            # A table row is one line, its cells in order: a chunk never splits a row, nor
            # joins one row's cells with another's.
            cells = [c.get_text(" ", strip=True) for c in element.find_all(["td", "th"])]
            text = " | ".join(cells).strip(" |")
        elif element.find_parent("tr") is not None:
            continue  # within a row: its row has it
        elif element.name.startswith("h") and element.name[1:].isdigit():
            level = int(element.name[1])
            heading = element.get_text(" ", strip=True)
            if heading:
                path = [*path[: level - 1], heading[:MAX_SECTION_CHARS]]
                sections.append(Section(offset, " > ".join(path)[-MAX_SECTION_CHARS:]))
            text = heading
        else:
            # A block that holds other blocks (a list item with a nested list) keeps only its
            # own text here; the blocks inside are visited in their turn.
            text = (
                _own_text(element)
                if element.find([*_BLOCK_TAGS, "tr"])
                else element.get_text(" ", strip=True)
            )
        if text:
            parts.append(text)
            offset += len(text) + 2
    if not parts:
        loose = body.get_text(" ", strip=True)
        return ParsedDocument(loose, sections)
    return ParsedDocument("\n\n".join(parts), sections)


def _own_text(element: Any) -> str:
    """The element's text outside the blocks it holds."""
    from bs4 import Tag
    from bs4.element import NavigableString

    pieces = []
    for child in element.children:
        if isinstance(child, NavigableString):
            pieces.append(str(child))
        elif (
            isinstance(child, Tag)
            and child.name not in _BLOCK_TAGS
            and not child.find([*_BLOCK_TAGS, "tr"])  # a nested list or table: visited itself
        ):
            pieces.append(child.get_text(" "))
    return " ".join(" ".join(pieces).split())


def _parse_pdf(raw: bytes) -> ParsedDocument:
    from pypdf import PdfReader

    try:
        reader = PdfReader(io.BytesIO(raw))
        pages = [page.extract_text() or "" for page in reader.pages]
    except Exception as e:  # pypdf raises many kinds (NotImplementedError for a filter it lacks)
        if is_retriable(e) or isinstance(e, MemoryError):
            raise  # the task's time ran out, or the process's memory: not the file's fault
        raise ParseError(f"the PDF could not be read ({type(e).__name__}: {e})") from e
    parts: list[str] = []
    sections: list[Section] = []
    offset = 0
    for number, page_text in enumerate(pages, start=1):
        page_text = page_text.strip()
        if not page_text:
            continue
        sections.append(Section(offset, f"page {number}", _page_flags(page_text)))
        parts.append(page_text)
        offset += len(page_text) + 2
    if not parts:
        raise ParseError("the PDF has no text layer (scanned images are not OCRed)")
    return ParsedDocument("\n\n".join(parts), sections)


def _page_flags(page_text: str) -> tuple[str, ...]:
    visible = [c for c in page_text if not c.isspace()]
    alphanumeric = sum(1 for c in visible if c.isalnum())
    letters = sum(1 for c in visible if c.isalpha())
    if alphanumeric < THIN_PAGE_CHARS or letters < MIN_LETTER_SHARE * len(visible):
        return (DOUBTFUL_EXTRACTION,)
    return ()


def _load_json(raw: bytes) -> object:
    try:
        return _json_loads(_decode(raw))
    except json.JSONDecodeError as e:
        raise ParseError(f"invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from e


def _load_jsonl(raw: bytes) -> list[object]:
    records = []
    for number, line in enumerate(_decode(raw).splitlines(), start=1):
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
