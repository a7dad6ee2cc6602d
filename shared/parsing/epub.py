"""EPUB, read by EbookLib: the chapters in the order of the book's spine (the reading order),
each read by the HTML parser and kept as a section of its own under its file's first heading
(or the book's title for a chapter without one)."""

from __future__ import annotations

import io
import warnings

from shared.errors import ParseError
from shared.parsing.containers import open_zip
from shared.parsing.document import ParsedDocument, ParseOptions, TextBuilder
from shared.parsing.html import parse_html

MAX_CHAPTERS = 5000


def parse(raw: bytes, options: ParseOptions) -> ParsedDocument:
    import ebooklib
    from ebooklib import epub

    open_zip(raw).close()  # checked before EbookLib inflates anything
    try:
        with warnings.catch_warnings():  # EbookLib warns of its own future defaults
            warnings.simplefilter("ignore")
            book = epub.read_epub(io.BytesIO(raw), {"ignore_ncx": True})
    except Exception as e:  # EbookLib raises EpubException, KeyError, lxml errors
        raise ParseError(f"the EPUB could not be read ({type(e).__name__}: {e})") from e
    if len(book.spine) > MAX_CHAPTERS:
        raise ParseError(f"the book has {len(book.spine)} chapters; the limit is {MAX_CHAPTERS}")
    out = TextBuilder()
    # A chapter once, where the spine first names it (a spine of 1,000 references to one
    # chapter read it 1,000 times).
    for idref in dict.fromkeys(idref for idref, _linear in book.spine):
        item = book.get_item_with_id(idref)
        if item is None or item.get_type() != ebooklib.ITEM_DOCUMENT:
            continue
        chapter = parse_html(item.get_content().decode("utf-8", "replace"))
        if chapter.text.strip():
            # The chapter's headings are its sections; "" keeps them at the top level.
            out.include(chapter, 1, "")
    return out.build()
