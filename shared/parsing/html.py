"""HTML, read by Beautiful Soup: headings to the section path, navigation and other boilerplate
left out, tables a row at a time under their header row."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from shared.parsing.document import (
    MAX_SECTION_CHARS,
    PERMALINK_SIGNS,
    TABLE,
    HeadingPath,
    ParsedDocument,
    ParseOptions,
    Section,
    decode_utf8,
)


def parse(raw: bytes, options: ParseOptions) -> ParsedDocument:
    return parse_html(decode_utf8(raw))


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


def _drop_navigation(root: Any) -> None:
    """Remove navigation from ``root``: blocks whose words are nearly all links' words,
    page bars, and permalink signs. Linear in the document: each element's text and link
    lengths are summed once from its children's (post-order, an explicit stack), then the
    outermost navigation blocks are removed."""
    from bs4.element import Tag

    sizes, first_words, permalinks = _link_density(_post_order(root))
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


def _post_order(root: Any) -> list[Any]:
    """Every element under ``root`` (itself last), each after its children."""
    from bs4.element import Tag

    order: list[Any] = []
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if children_done:
            order.append(node)
            continue
        stack.append((node, True))
        stack.extend((c, False) for c in node.children if isinstance(c, Tag))
    return order


def _link_density(
    order: list[Any],
) -> tuple[dict[int, tuple[int, int, int]], dict[int, str], list[Any]]:
    """Per element (by id), in one pass over ``order`` (children first): its text chars, the
    chars within links and the number of links; its first words; and the permalink signs."""
    from bs4.element import CData, NavigableString, Tag

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
                and node.get_text().strip() in (PERMALINK_SIGNS)
            ):
                permalinks.append(node)
        sizes[id(node)] = (text, link, links)
        first_words[id(node)] = start
    return sizes, first_words, permalinks


_BLOCK_TAGS = ("p", "li", "pre", "blockquote", "td", "th", "dd", "dt", "figcaption", "div")


_HEADING_TAGS = ("h1", "h2", "h3", "h4", "h5", "h6")


def parse_html(html: str) -> ParsedDocument:
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
        self.path = HeadingPath()
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
