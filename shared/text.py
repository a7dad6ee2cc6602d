"""Text every store accepts. Postgres refuses a NUL in text and jsonb, and a lone surrogate
cannot be encoded to UTF-8 at all; both reach us inside uploads (JSON's "\\u0000" and
"\\ud800", a PDF's text layer) and inside messages we record about them (a library's error
that quotes the content, a webhook receiver's answer)."""

from __future__ import annotations

import re

_SURROGATE = re.compile("[\ud800-\udfff]")


def storable_text(text: str) -> str:
    """``text`` with each NUL a space and each lone surrogate U+FFFD: one character for one,
    so offsets into it (a parsed document's sections) still hold."""
    text = text.replace("\x00", " ")
    return text if text.isascii() else _SURROGATE.sub("\ufffd", text)
