"""Turn an upload's bytes into text plus the section (heading path) of every span of it.

A parse failure raises ``ParseError`` with a reason a person can act on; retrying won't help.
"""

from __future__ import annotations

import bisect
import io
import json
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
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
        "text": lambda: _parse_text(_decode(raw)),
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
        return self.current()

    def current(self) -> str:
        return " > ".join(t for _, t in self.levels)[-MAX_SECTION_CHARS:]


# The section flag of a table's rows: chunked a row at a time (never mid-row), and each
# chunk's section ends with the table's header row, so every chunk of it says its columns.
TABLE = "table"
# The section flag of a code block: kept whole where it fits a chunk (else cut between lines).
CODE = "code"


@lru_cache(maxsize=1)
def _markdown() -> Any:
    """Blocks only (the inline rules are a quarter of the parse and nothing reads them), GFM
    tables, and YAML front matter recognised as such (not as a setext heading)."""
    from markdown_it import MarkdownIt
    from mdit_py_plugins.front_matter import front_matter_plugin

    return MarkdownIt("commonmark").enable("table").disable("inline").use(front_matter_plugin)


def _parse_markdown(text: str) -> ParsedDocument:
    """CommonMark as markdown-it-py reads it (ATX and setext headings, fenced and indented
    code, GFM tables): heading lines go to the section path, not into the text; a table's
    header row goes into the section path of its rows; HTML comments and YAML front matter
    are left out."""
    # Lines as markdown-it numbers them: ended by \n, \r\n or \r only (str.splitlines also
    # ends one at \x0c, \x85, U+2028..., and would put each heading a line off).
    lines = _MARKDOWN_LINE.findall(text)
    headings: dict[int, tuple[int, int, str]] = {}  # first line: level, end line, title
    comments: dict[int, int] = {}  # first line: end line (front matter too)
    tables: dict[int, tuple[int, str]] = {}  # first line: end line, header row
    code: dict[int, int] = {}  # first line: end line
    tokens = _markdown().parse(text)
    for i, token in enumerate(tokens):
        if token.map is None:
            continue
        first, end = token.map
        if token.type == "heading_open":
            headings[first] = (int(token.tag[1]), end, _inline_text(tokens[i + 1]))
        elif token.type == "front_matter" or (
            token.type == "html_block" and token.content.lstrip().startswith("<!--")
        ):
            comments[first] = end
        elif token.type == "table_open" and first + 2 <= end:
            tables[first] = (end, " ".join(lines[first].split()))
        elif token.type in ("fence", "code_block"):
            code[first] = end
    sections: list[Section] = []
    path = _HeadingPath()
    kept: list[str] = []
    titles: list[str] = []
    offset = 0
    n = 0
    while n < len(lines):
        if n in headings:
            level, end, title = headings[n]
            if title:
                sections.append(Section(offset, path.enter(level, title)))
                titles.append(title)
            n = max(end, n + 1)
        elif n in comments:
            n = max(comments[n], n + 1)
        elif n in tables or n in code:
            within = path.current()
            if n in tables:  # its rows, under a path that ends with its header row
                end, header = tables[n]
                block_path, flag, first = f"{within} > {header}" if within else header, TABLE, n + 2
            else:
                end, block_path, flag, first = max(code[n], n + 1), within, CODE, n
            sections.append(Section(offset, block_path[-MAX_SECTION_CHARS:], (flag,)))
            for line in lines[first:end]:
                kept.append(line)
                offset += len(line)
            sections.append(Section(offset, within))  # the heading's section again after it
            n = end
        else:
            kept.append(lines[n])
            offset += len(lines[n])
            n += 1
    body = "".join(kept)
    if not body.strip() and titles:  # headings only: their words are the text
        return ParsedDocument("\n\n".join(titles))
    return ParsedDocument(body, sections)


_MARKDOWN_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")
_LINK = re.compile(r"!?\[([^\]\n]*)\]\([^)\n]*\)")


def _inline_text(inline: Any) -> str:
    """A heading's words: its text without the markup of code spans, emphasis and links (an
    identifier's underscores stay: they are part of its name)."""
    return " ".join(_LINK.sub(r"\1", inline.content).replace("`", "").replace("*", "").split())


# Structure in plain text. A man page as `man` renders it: a running header and footer line
# ("GREP(1)   User Commands   GREP(1)"), sections in capitals at the margin, subsections
# indented three spaces, justified lines (runs of spaces between words). Any text: a heading
# underlined (and perhaps overlined) with a run of one punctuation character, as
# reStructuredText and setext Markdown write them.
_MAN_HEADER = re.compile(r"\S+\(\d\w*\)[ \t].*[ \t]\S+\(\d\w*\)[ \t]*")
# the header, or the footer ("GNU grep 3.8     2019-12-29     GREP(1)"): at the margin, the
# page's name last (a SEE ALSO line of names is indented)
_MAN_RUNNING_LINE = re.compile(r"\S.*[ \t]{2,}\S+\(\d\w*\)[ \t]*")
_MAN_SECTION = re.compile(r"[A-Z][A-Z0-9 ,/()&-]{0,60}")
_MAN_SUBSECTION = re.compile(r"   [A-Z][^ \t][^\n]{0,70}")
_JUSTIFIED = re.compile(r"(?<=\S)[ \t]{2,}(?=\S)")
_UNDERLINE = re.compile(r"([=\-~^*#+\"'`:.])\1{2,}[ \t]*")


def _parse_text(text: str) -> ParsedDocument:
    """Plain text with the structure it shows: man-page sections or underlined headings go
    to the section path (their lines leave the text). One pass over the lines."""
    lines = text.splitlines(keepends=True)
    first = next((line for line in lines if line.strip()), "")
    if _MAN_HEADER.fullmatch(first.rstrip("\r\n")):
        return _parse_man_page(lines)
    return _parse_underlined(lines)


def _parse_man_page(lines: list[str]) -> ParsedDocument:
    sections: list[Section] = []
    path = _HeadingPath()
    kept: list[str] = []
    offset = 0
    for i, line in enumerate(lines):
        bare = line.rstrip("\r\n")
        if _MAN_RUNNING_LINE.fullmatch(bare):
            continue  # the running header or footer, on every page
        heading = None
        if _MAN_SECTION.fullmatch(bare.rstrip()):
            heading = (1, bare.strip())
        elif _MAN_SUBSECTION.fullmatch(bare.rstrip()) and _indented_next(lines, i + 1):
            heading = (2, bare.strip())
        if heading is not None:
            sections.append(Section(offset, path.enter(*heading)))
            continue
        line = _JUSTIFIED.sub(" ", line)
        kept.append(line)
        offset += len(line)
    return ParsedDocument("".join(kept), sections)


def _indented_next(lines: list[str], start: int) -> bool:
    """Whether the next non-blank line is indented deeper than a subsection heading."""
    for line in lines[start : start + 3]:
        if line.strip():
            return line.startswith("    ")
    return False


def _parse_underlined(lines: list[str]) -> ParsedDocument:
    sections: list[Section] = []
    path = _HeadingPath()
    styles: list[tuple[str, bool]] = []  # underline styles in order of first use: the levels
    kept: list[str] = []
    offset = 0
    i = 0
    while i < len(lines):
        title, used = _underlined_heading(lines, i)
        if title is not None:
            style = used[0]
            if style not in styles:
                styles.append(style)
            sections.append(Section(offset, path.enter(styles.index(style) + 1, title)))
            i += used[1]
            continue
        kept.append(lines[i])
        offset += len(lines[i])
        i += 1
    body = "".join(kept)
    if not body.strip():
        return ParsedDocument("".join(lines))
    return ParsedDocument(body, sections)


def _underlined_heading(
    lines: list[str], i: int
) -> tuple[str | None, tuple[tuple[str, bool], int]]:
    """The heading at line ``i`` (its title, its style, and the lines it takes), if any: a
    line of text whose next line is a run of one punctuation character at least nearly as
    long, perhaps with the same run above it."""
    none: tuple[None, tuple[tuple[str, bool], int]] = (None, (("", False), 0))
    overline = _UNDERLINE.fullmatch(lines[i].rstrip("\r\n"))
    at = i + 1 if overline else i
    if at + 1 >= len(lines):
        return none
    title = lines[at].strip()
    under = _UNDERLINE.fullmatch(lines[at + 1].rstrip("\r\n"))
    if (
        not title
        or len(title) > MAX_SECTION_CHARS
        or under is None
        or _UNDERLINE.fullmatch(title)
        or len(under.group().strip()) < max(3, int(len(title) * 0.7))
        or (overline is not None and overline.group(1) != under.group(1))
    ):
        return none
    return title, ((under.group(1), overline is not None), at + 2 - i)


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
# Controls, not text (a code block's "copy" button, a version picker's options), dropped
# unless in a heading: an accordion's question is a <button> in an <h3> (WAI-ARIA's pattern).
_CONTROL_TAGS = frozenset(("button", "select"))
# Elements within a line of text; any other element (<br>, a <section>, an <li>) parts the
# words either side of it.
_INLINE_TAGS = frozenset(
    (
        "a", "abbr", "acronym", "b", "bdi", "bdo", "big", "cite", "code", "data", "del",
        "dfn", "em", "font", "i", "ins", "kbd", "label", "mark", "q", "s", "samp", "small",
        "span", "strike", "strong", "sub", "sup", "time", "tt", "u", "var", "wbr",
    )
)  # fmt: skip
# ARIA landmarks of the same (a <div role="navigation"> is a <nav>).
_BOILERPLATE_ROLES = ("navigation", "banner", "contentinfo", "search", "complementary")
# Blocks that are navigation when nearly all their words are links' words (a sidebar, a table
# of contents, a Prev/Up/Next bar), as main-content extractors judge them (link density).
_NAVIGATION_CANDIDATES = frozenset(("ul", "ol", "dl", "div", "table", "p", "section", "menu"))
NAVIGATION_LINK_SHARE = 0.75
NAVIGATION_MIN_LINKS = 3
# A texinfo page's bar ("Next: X, Previous: Y, Up: Z [Index]") has two or three links.
_PAGE_BAR = re.compile(r"\s*(Next|Previous|Prev|Up):")
PAGE_BAR_CHARS = 200
# A heading's permalink: a link to its own anchor whose text is a sign.
_PERMALINK_SIGNS = frozenset(("¶", "§", "#", "🔗", "⚓"))


def _drop_navigation(root: Any) -> None:
    """Remove navigation from ``root``: blocks whose words are nearly all links' words,
    page bars, and permalink signs. Linear in the document: each element's text and link
    lengths are summed once from its children's (post-order, an explicit stack), then the
    outermost navigation blocks are removed."""
    from bs4.element import CData, NavigableString, Tag

    order: list[Any] = []
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if children_done:
            order.append(node)
            continue
        stack.append((node, True))
        stack.extend((c, False) for c in node.children if isinstance(c, Tag))
    sizes: dict[int, tuple[int, int, int]] = {}  # text chars, link chars, links
    first_words: dict[int, str] = {}
    permalinks = []
    for node in order:
        text = link = links = 0
        start = ""
        for child in node.children:
            if isinstance(child, Tag):
                child_text, child_link, child_links = sizes[id(child)]
                text, link = text + child_text, link + child_link
                links += child_links
                start = start or first_words.get(id(child), "")
            elif type(child) in (NavigableString, CData):
                words = child.strip()
                text += len(words)
                start = start or words[:12]
        if node.name == "a":
            link, links = text, links + 1
            href = node.get("href")
            if (
                isinstance(href, str)
                and href.startswith("#")
                and node.get_text().strip() in (_PERMALINK_SIGNS)
            ):
                permalinks.append(node)
        sizes[id(node)] = (text, link, links)
        first_words[id(node)] = start
    navigation = []
    stack_nodes = [root]
    while stack_nodes:
        node = stack_nodes.pop()
        text, link, links = sizes[id(node)]
        if (
            node is not root
            and node.name in _NAVIGATION_CANDIDATES
            and text
            and (
                (links >= NAVIGATION_MIN_LINKS and link >= NAVIGATION_LINK_SHARE * text)
                or (
                    links >= 1 and text <= PAGE_BAR_CHARS and _PAGE_BAR.match(first_words[id(node)])
                )
            )
        ):
            navigation.append(node)
            continue
        stack_nodes.extend(c for c in node.children if isinstance(c, Tag))
    for node in navigation + permalinks:
        node.decompose()


_BLOCK_TAGS = ("p", "li", "pre", "blockquote", "td", "th", "dd", "dt", "figcaption", "div")


_HEADING_TAGS = ("h1", "h2", "h3", "h4", "h5", "h6")


def _parse_html(html: str) -> ParsedDocument:
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(html, "html.parser")
    for tag in soup(list(_BOILERPLATE_TAGS)):
        tag.decompose()
    for tag in soup.find_all(True, attrs={"role": list(_BOILERPLATE_ROLES)}):
        tag.decompose()
    body = soup.find("main") or soup.find("article") or soup.body or soup
    _drop_navigation(body)
    lines = _HtmlLines()
    lines.walk(body)
    parts = lines.parts()
    if not parts:
        return ParsedDocument(body.get_text(" ", strip=True))
    return ParsedDocument("\n\n".join(parts), lines.sections())


@dataclass
class _Block:
    kind: str  # "block", "heading", "table", "row" or "cell"
    # Its line's place among the document's lines (a cell's is its row's); None for a block
    # whose text so far went into a line before a block it holds: its next words start a
    # line after that block, so that words after a heading stay in the heading's section.
    slot: int | None
    level: int = 0  # a heading's
    row: _Block | None = None  # a cell's
    pieces: list[str] = field(default_factory=list)
    closed: bool = False  # a cell whose next cell was nested in it (no </td>) closed it
    header: bool = False  # a <th> cell; a row of nothing else
    rows: int = 0  # a table's rows so far
    columns: str = ""  # a table's header row
    pre: bool = False  # a <pre>: its text as written, lines and indentation


def _edges_as_one_space(text: str) -> str:
    r"""``text`` with the whitespace at each of its ends made one space (string methods: the
    regex ``^\s+|\s+$`` backtracks over every run of spaces inside, quadratic in a run)."""
    inner = text.strip()
    if not inner:
        return " " if text else ""
    return (" " if text[0].isspace() else "") + inner + (" " if text[-1].isspace() else "")


_WHITESPACE = re.compile(r"\s+")


def _joined(block: _Block) -> str:
    """A block's text nodes as one line: in a <pre> as written, elsewhere with each run of
    whitespace one space (HTML's own rule for text outside <pre>)."""
    text = "".join(block.pieces)
    return text.strip() if block.pre else _WHITESPACE.sub(" ", text).strip()


class _HtmlLines:
    """The document's lines, in one pass over its elements, each text node read once: a
    block's (paragraph, list item, ...) own text, a heading, a table row's cells joined with
    " | ". A block inside a row or a heading is text of that row or heading, a row inside a
    cell is a line of its own, and a block that holds others keeps only its own words, in
    lines before and after the ones it holds (words after a heading are in its section).
    A table whose first row is header cells (<th>) is read as Markdown's are: that row goes
    into the section path of the rows after it, flagged ``TABLE``, so the chunker cuts the
    table between rows and every chunk of it names its columns.
    Linear in the document whatever its nesting: asking each element for its ancestors or
    its descendants, as this once did, made 17 KB of nested tables a gigabyte of text and
    100 KB of nested divs a minute of parsing, in a batch shared with other tenants'
    documents."""

    def __init__(self) -> None:
        self.slots: list[str] = []  # each block's line, reserved where the block starts
        # (slot, section path, flags) where a section starts: a heading's, a table's rows',
        # and the heading's again after the table
        self.marks: list[tuple[int, str, tuple[str, ...]]] = []
        self.path = _HeadingPath()
        self.open: list[_Block] = []

    def walk(self, root: Any) -> None:
        from bs4.element import CData, NavigableString, Tag

        # An explicit stack: a recursion as deep as the nesting would overflow.
        stack: list[tuple[Any, _Block | None, bool]] = [(iter(root.children), None, False)]
        while stack:
            children, opened, parts = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                if opened is not None:
                    self._close(self.open.pop())
                if parts:
                    self._part()
            elif isinstance(child, Tag):
                in_heading = bool(self.open) and self.open[-1].kind == "heading"
                if child.name in _CONTROL_TAGS and not in_heading:
                    continue
                parts = child.name not in _INLINE_TAGS
                if parts:
                    self._part(child.name)
                block = self._enter(child.name)
                if block is not None:
                    self.open.append(block)
                stack.append((iter(child.children), block, parts))
            elif type(child) in (NavigableString, CData):  # get_text's: not comments
                self._text(str(child))

    def _part(self, name: str = "") -> None:
        """Words either side of a <br> or a block's edge are two words, however the page is
        spaced (minified pages have no whitespace there): one space between them, a line
        break for a <br> in a <pre>."""
        block = self.open[-1] if self.open else None
        if block is None or block.kind == "row" or block.closed or not block.pieces:
            return
        if not block.pre:
            block.pieces.append(" ")
        elif name == "br":
            block.pieces.append("\n")

    def _enter(self, name: str) -> _Block | None:
        inner = self.open[-1] if self.open else None
        if inner is not None and inner.kind == "heading":
            return None  # all of a heading is its text
        if name == "tr":
            return self._reserve_row(inner)
        if inner is not None and inner.kind in ("row", "cell"):
            if name not in ("td", "th"):
                return None  # a block in a cell is the cell's text
            if inner.kind == "row":
                return _Block("cell", inner.slot, row=inner, header=name == "th")
            # A cell whose </td> was left out (valid HTML): html.parser nests the next cell
            # in it. The first ends where the second starts, and both are cells of the row.
            self._close(inner)
            return _Block("cell", inner.slot, row=inner.row, header=name == "th")
        if name == "table":
            if inner is not None and inner.kind == "block":
                self._end_line(inner)  # its words after the table go after it
            return _Block("table", None)
        if name in _HEADING_TAGS:
            return self._reserve("heading", inner, int(name[1]))
        if name in _BLOCK_TAGS:
            block = self._reserve("block", inner)
            block.pre = name == "pre"
            return block
        return None

    def _reserve(self, kind: str, inner: _Block | None, level: int = 0) -> _Block:
        if inner is not None and inner.kind == "block":
            self._end_line(inner)  # its words after this block go after it
        self.slots.append("")
        return _Block(kind, len(self.slots) - 1, level)

    def _end_line(self, block: _Block) -> None:
        if block.slot is not None and block.pieces:
            self.slots[block.slot] = _joined(block)
            block.pieces = []
        block.slot = None

    def _text(self, text: str) -> None:
        if not self.open:
            return
        block = self.open[-1]
        if block.kind == "row" or block.closed:
            return  # between a row's cells
        if not block.pre:
            # Spaced as the page spaces it: whitespace at a text node's edges is one space,
            # and inline markup between two nodes adds none ("<code>f()</code>." is "f().",
            # where joining stripped nodes with spaces gave "f() ." and, in highlighted
            # code, "console . log (process. env . PATH )").
            text = _edges_as_one_space(text)
        if not text.strip():
            if block.pieces:
                block.pieces.append(text)
            return
        if block.slot is None:
            self.slots.append("")
            block.slot = len(self.slots) - 1
        block.pieces.append(text)

    def _close(self, block: _Block) -> None:
        text = _joined(block)
        if block.kind == "cell":
            if not block.closed and block.row is not None:
                block.row.pieces.append(text)  # its row's, cells in order
                block.row.header = block.row.header and block.header
            block.closed = True
        elif block.kind == "table":
            if block.slot is not None:  # its own words (a caption)
                self.slots[block.slot] = text
            self._close_table(block)
        elif block.slot is None:
            return
        elif block.kind == "row":
            self.slots[block.slot] = " | ".join(block.pieces).strip(" |")
            self._close_row(block)
        else:
            self.slots[block.slot] = text
            if block.kind == "heading" and text:
                self.marks.append((block.slot, self.path.enter(block.level, text), ()))

    def _reserve_row(self, inner: _Block | None) -> _Block:
        row = self._reserve("row", inner)
        row.header = True  # until a cell of it is not a <th>
        return row

    def _close_row(self, row: _Block) -> None:
        table = self.open[-1] if self.open else None  # the row's own, when it is directly in one
        if table is None or table.kind != "table" or row.slot is None:
            return
        table.rows += 1
        line = self.slots[row.slot]
        # The first row, all <th>, and no line after it yet (html.parser nests the rows of a
        # table whose </tr> and </th> are left out inside its first cell: those rows close
        # before it, and it is then no header above them).
        last = row.slot == len(self.slots) - 1
        if table.rows == 1 and row.header and row.pieces and line and last:
            table.columns = line  # the header row: the rows' section path, not a line
            self.slots[row.slot] = ""
            within = self.path.current()
            path = f"{within} > {line}" if within else line
            self.marks.append((len(self.slots), path[-MAX_SECTION_CHARS:], (TABLE,)))

    def _close_table(self, table: _Block) -> None:
        if table.columns:  # after a table with a header row, the heading's section again
            self.marks.append((len(self.slots), self.path.current(), ()))

    def parts(self) -> list[str]:
        return [line for line in self.slots if line]

    def sections(self) -> list[Section]:
        starts, offset = [], 0
        for line in self.slots:
            starts.append(offset)
            if line:
                offset += len(line) + 2
        starts.append(offset)  # a mark after the last line (a table that ends the document)
        return [Section(starts[slot], path, flags) for slot, path, flags in self.marks]


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
    pages = [_pdf_text(page) for page in pages]
    running = _running_lines(pages)
    for number, page_text in enumerate(pages, start=1):
        page_text = _without_running_lines(page_text, running).strip()
        if not page_text:
            continue
        sections.append(Section(offset, f"page {number}", _page_flags(page_text)))
        parts.append(page_text)
        offset += len(page_text) + 2
    if not parts:
        raise ParseError("the PDF has no text layer (scanned images are not OCRed)")
    return ParsedDocument("\n\n".join(parts), sections)


# A word broken at a line's end by typesetting ("manip-\nulation"): joined again. Only
# between lowercase letters, so a compound at a line end ("GPL-\n3") keeps its hyphen.
_LINE_END_HYPHEN = re.compile(r"(?<=[a-z])-\n(?=[a-z])")
# A page's first and last lines that are the same on this share of the pages (digits aside:
# "Chapter 4: Function reference 15") are running headers and footers, page numbers among
# them, not text: they would start and end every chunk.
RUNNING_LINE_SHARE = 0.3
RUNNING_LINE_EDGE = 2  # lines at each end of a page that may be running ones


def _pdf_text(page_text: str) -> str:
    """A page's text as a reader sees it: ligatures and other compatibility characters as
    the letters they stand for (NFKC: "\ufb01" is "fi"), broken words joined."""
    text = _LINE_END_HYPHEN.sub("", unicodedata.normalize("NFKC", page_text))
    return _SPLIT_WORD.sub(_rejoined, text)


# Two lowercase pieces of one word that the text layer split with a space (justified text set
# with wide letter spacing: "retrie vals", "ab stract"). Joined where wordfreq's English list
# says so: the whole is a word and a piece is none ("retrie"), or the whole is a common word
# far more common than either piece ("infor mation"). Two words that also form one ("in to",
# "be fore", "some thing") stay apart: each piece is at least as common as the whole.
# (The second piece is looked ahead at, not taken: it is the first of the next pair.)
_SPLIT_WORD = re.compile(r"\b([a-z]{2,}) (?=([a-z]{2,})\b)")
WHOLE_WORD_ZIPF = 3.0  # once in a million words
WHOLE_WORD_LEAD = 1.0  # ten times as common as either piece


def _rejoined(match: re.Match[str]) -> str:
    """The first piece, and the space after it unless the two make one word."""
    first, second = match.group(1), match.group(2)
    whole = _zipf(first + second)
    if whole == 0.0:
        return match.group(0)
    pieces = (_zipf(first), _zipf(second))
    if min(pieces) == 0.0 or (whole >= WHOLE_WORD_ZIPF and whole >= max(pieces) + WHOLE_WORD_LEAD):
        return first
    return match.group(0)


@lru_cache(maxsize=65536)
def _zipf(word: str) -> float:
    from wordfreq import zipf_frequency

    return float(zipf_frequency(word, "en"))


def _line_shape(line: str) -> str:
    return re.sub(r"\d+", "#", line.strip())


def _edge_lines(page_text: str) -> list[str]:
    lines = [line for line in page_text.strip().splitlines() if line.strip()]
    if len(lines) <= 2 * RUNNING_LINE_EDGE:  # a short page: its first and last line only
        return lines[:1] + lines[-1:]
    return lines[:RUNNING_LINE_EDGE] + lines[-RUNNING_LINE_EDGE:]


def _running_lines(pages: list[str]) -> set[str]:
    shapes = Counter(
        shape for page in pages for shape in {_line_shape(x) for x in _edge_lines(page)}
    )
    needed = max(3, RUNNING_LINE_SHARE * sum(1 for page in pages if page.strip()))
    return {shape for shape, count in shapes.items() if count >= needed and shape}


def _without_running_lines(page_text: str, running: set[str]) -> str:
    if not running:
        return page_text
    lines = page_text.strip().splitlines()
    edge = set(range(RUNNING_LINE_EDGE)) | set(range(len(lines) - RUNNING_LINE_EDGE, len(lines)))
    return "\n".join(
        line for i, line in enumerate(lines) if i not in edge or _line_shape(line) not in running
    )


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
