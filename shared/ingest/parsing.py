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


class _HeadingPath:
    """The headings above a point of a document, as its section path. A heading replaces
    those of its level and below and sits under the nearest one above its level: a page
    whose headings start at h2 has its h2s side by side (by position, "Title > Next" was
    each under the one before)."""

    def __init__(self) -> None:
        self.levels: list[tuple[int, str]] = []

    def enter(self, level: int, title: str) -> str:
        while self.levels and self.levels[-1][0] >= level:
            self.levels.pop()
        self.levels.append((level, title[:MAX_SECTION_CHARS].rstrip()))
        return " > ".join(t for _, t in self.levels)[-MAX_SECTION_CHARS:]


def _parse_markdown(text: str) -> ParsedDocument:
    """Heading lines go to the section path, not into the text (a chunk's text never starts
    with ``## ``); a ``#`` line inside a fenced code block is code, not a heading. One pass
    over the lines: linear in the input whatever its lines hold."""
    sections: list[Section] = []
    path = _HeadingPath()
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
                sections.append(Section(offset, path.enter(level, title)))
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


_HEADING_TAGS = ("h1", "h2", "h3", "h4", "h5", "h6")


def _parse_html(html: str) -> ParsedDocument:
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(html, "html.parser")
    for tag in soup(list(_BOILERPLATE_TAGS)):
        tag.decompose()
    body = soup.find("main") or soup.find("article") or soup.body or soup
    lines = _HtmlLines()
    lines.walk(body)
    parts = lines.parts()
    if not parts:
        return ParsedDocument(body.get_text(" ", strip=True))
    return ParsedDocument("\n\n".join(parts), lines.sections())


@dataclass
class _Block:
    kind: str  # "block", "heading", "row" or "cell"
    # Its line's place among the document's lines (a cell's is its row's); None for a block
    # whose text so far went into a line before a block it holds: its next words start a
    # line after that block, so that words after a heading stay in the heading's section.
    slot: int | None
    level: int = 0  # a heading's
    row: _Block | None = None  # a cell's
    pieces: list[str] = field(default_factory=list)
    closed: bool = False  # a cell whose next cell was nested in it (no </td>) closed it


class _HtmlLines:
    """The document's lines, in one pass over its elements, each text node read once: a
    block's (paragraph, list item, ...) own text, a heading, a table row's cells joined with
    " | ". A block inside a row or a heading is text of that row or heading, a row inside a
    cell is a line of its own, and a block that holds others keeps only its own words, in
    lines before and after the ones it holds (words after a heading are in its section).
    Linear in the document whatever its nesting: asking each element for its ancestors or
    its descendants, as this once did, made 17 KB of nested tables a gigabyte of text and
    100 KB of nested divs a minute of parsing, in a batch shared with other tenants'
    documents."""

    def __init__(self) -> None:
        self.slots: list[str] = []  # each block's line, reserved where the block starts
        self.headings: list[tuple[int, str]] = []  # (slot, section path)
        self.path = _HeadingPath()
        self.open: list[_Block] = []

    def walk(self, root: Any) -> None:
        from bs4.element import CData, NavigableString, Tag

        # An explicit stack: a recursion as deep as the nesting would overflow.
        stack: list[tuple[Any, _Block | None]] = [(iter(root.children), None)]
        while stack:
            children, opened = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                if opened is not None:
                    self._close(self.open.pop())
            elif isinstance(child, Tag):
                block = self._enter(child.name)
                if block is not None:
                    self.open.append(block)
                stack.append((iter(child.children), block))
            elif type(child) in (NavigableString, CData):  # get_text's: not comments
                self._text(str(child))

    def _enter(self, name: str) -> _Block | None:
        inner = self.open[-1] if self.open else None
        if inner is not None and inner.kind == "heading":
            return None  # all of a heading is its text
        if name == "tr":
            return self._reserve("row", inner)
        if inner is not None and inner.kind in ("row", "cell"):
            if name not in ("td", "th"):
                return None  # a block in a cell is the cell's text
            if inner.kind == "row":
                return _Block("cell", inner.slot, row=inner)
            # A cell whose </td> was left out (valid HTML): html.parser nests the next cell
            # in it. The first ends where the second starts, and both are cells of the row.
            self._close(inner)
            return _Block("cell", inner.slot, row=inner.row)
        if name in _HEADING_TAGS:
            return self._reserve("heading", inner, int(name[1]))
        if name in _BLOCK_TAGS:
            return self._reserve("block", inner)
        return None

    def _reserve(self, kind: str, inner: _Block | None, level: int = 0) -> _Block:
        if inner is not None and inner.kind == "block":
            self._end_line(inner)  # its words after this block go after it
        self.slots.append("")
        return _Block(kind, len(self.slots) - 1, level)

    def _end_line(self, block: _Block) -> None:
        if block.slot is not None and block.pieces:
            self.slots[block.slot] = " ".join(block.pieces)
            block.pieces = []
        block.slot = None

    def _text(self, text: str) -> None:
        text = text.strip()
        if not text or not self.open:
            return
        block = self.open[-1]
        if block.kind == "row" or block.closed:
            return  # between a row's cells
        if block.slot is None:
            self.slots.append("")
            block.slot = len(self.slots) - 1
        block.pieces.append(text)

    def _close(self, block: _Block) -> None:
        text = " ".join(block.pieces)
        if block.kind == "cell":
            if not block.closed and block.row is not None:
                block.row.pieces.append(text)  # its row's, cells in order
            block.closed = True
        elif block.slot is None:
            return
        elif block.kind == "row":
            self.slots[block.slot] = " | ".join(block.pieces).strip(" |")
        else:
            self.slots[block.slot] = text
            if block.kind == "heading" and text:
                self.headings.append((block.slot, self.path.enter(block.level, text)))

    def parts(self) -> list[str]:
        return [line for line in self.slots if line]

    def sections(self) -> list[Section]:
        starts, offset = [], 0
        for line in self.slots:
            starts.append(offset)
            if line:
                offset += len(line) + 2
        return [Section(starts[slot], path) for slot, path in self.headings]


def _parse_pdf(raw: bytes) -> ParsedDocument:
    from pypdf import PdfReader

    try:
        reader = PdfReader(io.BytesIO(raw))
        pages = [page.extract_text() or "" for page in reader.pages]
    except Exception as e:  # pypdf raises many kinds (NotImplementedError for a filter it lacks)
        if is_retriable(e):
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
    for number, line in enumerate(_JSONL_LINE_END.split(_decode(raw)), start=1):
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
