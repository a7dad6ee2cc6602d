"""Markdown (CommonMark with GFM tables), read by markdown-it-py."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from shared.parsing.document import (
    CODE,
    MAX_SECTION_CHARS,
    TABLE,
    HeadingPath,
    ParsedDocument,
    ParseOptions,
    Section,
    decode_utf8,
)


def parse(raw: bytes, options: ParseOptions) -> ParsedDocument:
    return _parse_markdown(decode_utf8(raw))


def _markdown() -> Any:
    """Blocks only (the inline rules are a quarter of the parse and nothing reads them), GFM
    tables, and YAML front matter recognised as such (not as a setext heading)."""
    from markdown_it import MarkdownIt
    from mdit_py_plugins.front_matter import front_matter_plugin

    return MarkdownIt("commonmark").enable("table").disable("inline").use(front_matter_plugin)


@dataclass
class _Blocks:
    """Where markdown-it found each kind of block, by its first line."""

    headings: dict[int, tuple[int, int, str]] = field(default_factory=dict)  # level, end, title
    comments: dict[int, int] = field(default_factory=dict)  # end line (front matter too)
    tables: dict[int, tuple[int, str]] = field(default_factory=dict)  # end line, header row
    code: dict[int, int] = field(default_factory=dict)  # end line

    @classmethod
    def of(cls, text: str, lines: list[str]) -> _Blocks:
        found = cls()
        tokens = _markdown().parse(text)
        for i, token in enumerate(tokens):
            if token.map is None:
                continue
            first, end = token.map
            if token.type == "heading_open":
                found.headings[first] = (int(token.tag[1]), end, _inline_text(tokens[i + 1]))
            elif token.type == "front_matter" or (
                token.type == "html_block" and token.content.lstrip().startswith("<!--")
            ):
                found.comments[first] = end
            elif token.type == "table_open" and first + 2 <= end:
                found.tables[first] = (end, " ".join(lines[first].split()))
            elif token.type in ("fence", "code_block"):
                found.code[first] = end
        return found


def _parse_markdown(text: str) -> ParsedDocument:
    """CommonMark as markdown-it-py reads it (ATX and setext headings, fenced and indented
    code, GFM tables): heading lines go to the section path, not into the text; a table's
    header row goes into the section path of its rows; HTML comments and YAML front matter
    are left out."""
    # Lines as markdown-it numbers them: ended by \n, \r\n or \r only (str.splitlines also
    # ends one at \x0c, \x85, U+2028..., and would put each heading a line off).
    lines = _MARKDOWN_LINE.findall(text)
    blocks = _Blocks.of(text, lines)
    headings, comments, tables, code = blocks.headings, blocks.comments, blocks.tables, blocks.code
    sections: list[Section] = []
    path = HeadingPath()
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
