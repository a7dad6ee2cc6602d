"""What every parser returns: the text, and the section (heading path) and flags of every span
of it; and the pieces the parsers share (heading paths, UTF-8 decoding, the section flags the
chunker reads)."""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field

from shared.errors import ParseError

# Section flags. Text that parsing doubts (a PDF page whose text layer is thin or mostly not
# letters, text read by OCR): chunks to check before use.
DOUBTFUL_EXTRACTION = "doubtful_extraction"
# Text read from a page's image by OCR (always doubtful too).
OCR = "ocr"


@dataclass(frozen=True)
class ParseOptions:
    """What a parse may be told besides the bytes."""

    # The fields of a JSON record that hold its text, in order.
    json_text_fields: tuple[str, ...] = ("text", "body", "content", "abstract")
    # How a part of a document in a format of its own (an e-mail's attachment) is read:
    # (file name, declared content type, bytes) -> its parse. The registry sets it, so no
    # format's module imports the registry.
    parse_part: Callable[[str, str, bytes], ParsedDocument] | None = None
    # OCR's bounds per document (settings: ocr_max_pages, ocr_budget_s)
    ocr_max_pages: int = 40
    ocr_budget_s: float = 120.0
    # PDFium's bounds per document (settings: pdf_text_timeout_s, _memory_mb, _max_chars)
    pdf_text_timeout_s: float = 60.0
    pdf_text_memory_mb: int = 2048
    pdf_text_max_chars: int = 80_000_000


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
    # What parsing left unread, for the job's detail (e.g. pages past OCR's bounds).
    notes: list[str] = field(default_factory=list)

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


def decode_utf8(raw: bytes) -> str:
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ParseError(
            f"the document is not valid UTF-8 (byte {e.start}: {raw[e.start : e.start + 1]!r}); "
            "re-encode it as UTF-8"
        ) from e


MAX_SECTION_CHARS = 500  # of a heading path kept with each chunk


class HeadingPath:
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
        return self.current()

    def current(self) -> str:
        return " > ".join(t for _, t in self.levels)[-MAX_SECTION_CHARS:]


# A heading's permalink, which a web page puts after it and converters keep (pandoc writes it
# into Word and OpenDocument files as a link to the heading's own anchor): a sign, no words.
PERMALINK_SIGNS = frozenset(("¶", "§", "#", "🔗", "⚓"))


# The section flag of a table's rows: chunked a row at a time (never mid-row), and each
# chunk's section ends with the table's header row, so every chunk of it says its columns.
TABLE = "table"
# The section flag of a code block: kept whole where it fits a chunk (else cut between lines).
CODE = "code"


class TextBuilder:
    """Builds a ParsedDocument block by block, for the formats whose library hands over
    structure (headings, paragraphs, tables, slides, sheets) rather than text: blocks are
    separated by a blank line, a heading goes to the section path (and with
    ``headings_in_text``, into the text as its section's first line, as the HTML and Markdown
    parsers write it), a table's rows go a row to a line under a path that ends with its
    header row (``TABLE``: the chunker never cuts a row, and every chunk of the table says its
    columns)."""

    def __init__(self, *, headings_in_text: bool = False) -> None:
        self.parts: list[str] = []
        self.sections: list[Section] = []
        self.path = HeadingPath()
        self.titles: list[str] = []
        self.offset = 0
        self.headings_in_text = headings_in_text

    def heading(self, level: int, title: str) -> None:
        title = " ".join(title.split())
        if title:
            self.sections.append(Section(self.offset, self.path.enter(level, title)))
            self.titles.append(title)
            if self.headings_in_text:
                self.paragraph(title)

    def paragraph(self, text: str) -> None:
        text = text.strip()
        if text:
            self.parts.append(text)
            self.offset += len(text) + 2

    def table(self, header: list[str], rows: list[list[str]]) -> None:
        """Rows (lists of cell texts) under their header row; rows without text are left out."""
        lines = [" | ".join(" ".join(cell.split()) for cell in row) for row in rows if any(row)]
        if not lines:
            if any(header):
                self.paragraph(" | ".join(header))
            return
        within = self.path.current()
        head = " | ".join(" ".join(cell.split()) for cell in header)
        block_path = f"{within} > {head}" if within and head else within or head
        self.sections.append(Section(self.offset, block_path[-MAX_SECTION_CHARS:], (TABLE,)))
        self.paragraph("\n".join(lines))
        self.sections.append(Section(self.offset, within))

    def include(self, parsed: ParsedDocument, level: int, title: str) -> None:
        """Another parse's text and sections as a part of this document, under ``title``
        at ``level`` (an e-book's chapter, an e-mail's attachment)."""
        self.heading(level, title)
        within = self.path.current()
        text = parsed.text
        if not text.strip():
            return
        start = self.offset
        for section in parsed.sections:
            if section.start < len(text):
                path = " > ".join(part for part in (within, section.path) if part)
                self.sections.append(
                    Section(start + section.start, path[-MAX_SECTION_CHARS:], section.flags)
                )
        self.parts.append(text)
        self.offset += len(text) + 2
        self.sections.append(Section(self.offset, within))

    def build(self) -> ParsedDocument:
        body = "\n\n".join(self.parts)
        if not body.strip() and self.titles:  # headings only: their words are the text
            return ParsedDocument("\n\n".join(self.titles))
        # A section opened after the last block (a heading that ends the document, the path
        # again after a closing table) holds no text: the chunker never looks past the end.
        return ParsedDocument(body, [s for s in self.sections if s.start < len(body)])
