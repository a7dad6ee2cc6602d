"""Rich Text Format, read by striprtf: its text, then the plain-text parser's structure
(underlined headings). RTF's own heading styles are numbers into a style sheet that striprtf
does not resolve, so headings are found only where the text shows them."""

from __future__ import annotations

import re

from shared.errors import ParseError
from shared.parsing.document import ParsedDocument, ParseOptions
from shared.parsing.text import parse_text

_CELL_BREAK = re.compile(r"[ \t]*\n\|[ \t]*")


def parse(raw: bytes, options: ParseOptions) -> ParsedDocument:
    from striprtf.striprtf import rtf_to_text

    try:
        # RTF is 7-bit: characters beyond ASCII are escapes (\'e9, \u233), which striprtf
        # decodes; the file's bytes are read as Latin-1 so that no byte fails to decode.
        # Each field group on a line of its own (RTF ignores line ends): striprtf finds
        # hyperlinks with a pattern whose time is cubic in the length of the line holding
        # them (66 KB of fields on one line took 109 s).
        source = raw.decode("latin-1").replace("{\\field", "\n{\\field")
        text: str = rtf_to_text(source, errors="replace")  # type: ignore[no-untyped-call]
    except Exception as e:  # striprtf raises what its regular expressions and codecs raise
        raise ParseError(f"the RTF document could not be read ({type(e).__name__}: {e})") from e
    # A table row comes out a cell to a line, each cell after the first starting "|": one
    # line per row, as the other formats write them.
    text = _CELL_BREAK.sub(" | ", text.replace("\r\n", "\n"))
    return parse_text(text)
