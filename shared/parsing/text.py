"""Plain text, with the structure it shows (man pages as `man` renders them, underlined
headings)."""

from __future__ import annotations

import re

from shared.parsing.document import (
    MAX_SECTION_CHARS,
    HeadingPath,
    ParsedDocument,
    ParseOptions,
    Section,
    decode_utf8,
)


def parse(raw: bytes, options: ParseOptions) -> ParsedDocument:
    return parse_text(decode_utf8(raw))


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


def parse_text(text: str) -> ParsedDocument:
    """Plain text with the structure it shows: man-page sections or underlined headings go
    to the section path (their lines leave the text). One pass over the lines."""
    lines = text.splitlines(keepends=True)
    first = next((line for line in lines if line.strip()), "")
    if _MAN_HEADER.fullmatch(first.rstrip("\r\n")):
        return _parse_man_page(lines)
    return _parse_underlined(lines)


def _parse_man_page(lines: list[str]) -> ParsedDocument:
    sections: list[Section] = []
    path = HeadingPath()
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
    path = HeadingPath()
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
