"""Word (.docx), read by python-docx: headings from the paragraph styles (Title, Heading 1-9),
list items as lines starting "- ", tables a row at a time under their header row, footnotes
at the end under "Footnotes". Comments are left out (they are remarks about the text, in a
part of their own); tracked insertions are read as text, as Word shows them."""

from __future__ import annotations

import io
import re
from typing import Any

from docx.table import _Cell

from shared.errors import ParseError
from shared.parsing.containers import without_macros
from shared.parsing.document import PERMALINK_SIGNS, ParsedDocument, ParseOptions, TextBuilder

_HEADING_STYLE = re.compile(r"(?:heading|überschrift|titre|título)\s*(\d)", re.IGNORECASE)
_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"


def parse(raw: bytes, options: ParseOptions) -> ParsedDocument:
    import docx
    from docx.table import Table

    raw = without_macros(raw)  # checked (open_zip) before python-docx inflates anything
    try:
        document = docx.Document(io.BytesIO(raw))
    except Exception as e:  # python-docx raises ValueError, KeyError, lxml errors
        raise ParseError(f"the Word document could not be read ({type(e).__name__}: {e})") from e
    out = TextBuilder(headings_in_text=True)
    bookmarks = {b.get(f"{_W}name") for b in document.element.body.iter(f"{_W}bookmarkStart")}
    for block in document.iter_inner_content():
        if isinstance(block, Table):
            _table(out, block)
            continue
        level = _heading_level(block)
        if level is not None:
            out.heading(level, _heading_text(block, bookmarks))
        elif _is_list_item(block):
            out.paragraph(f"- {block.text.strip()}" if block.text.strip() else "")
        else:
            out.paragraph(block.text)
    notes = _footnotes(document)
    if notes:
        out.heading(1, "Footnotes")
        for note in notes:
            out.paragraph(note)
    return out.build()


def _heading_level(paragraph: Any) -> int | None:
    name = paragraph.style.name if paragraph.style is not None else ""
    if name == "Title":
        return 1
    found = _HEADING_STYLE.match(name)
    return int(found.group(1)) + 1 if found else None


def _heading_text(paragraph: Any, bookmarks: set[str]) -> str:
    """A heading's text without its permalink (a web page's "Error events#" made a Word
    file): a sign, last in the heading, linking within the document to the heading's own
    bookmark or to none (converters rename the bookmark and keep the page's anchor). A sign
    that links to another part of the document, or has text after it, is the heading's own."""
    text = str(paragraph.text).rstrip()
    p = paragraph._p
    own = {b.get(f"{_W}name") for b in p.iter(f"{_W}bookmarkStart")}
    before = p.getprevious()
    while before is not None and before.tag == f"{_W}bookmarkStart":  # pandoc puts it there
        own.add(before.get(f"{_W}name"))
        before = before.getprevious()
    for link in p.iter(f"{_W}hyperlink"):
        anchor = link.get(f"{_W}anchor")
        sign = "".join(t.text or "" for t in link.iter(f"{_W}t")).strip()
        after = "".join(
            t.text or "" for sibling in link.itersiblings() for t in sibling.iter(f"{_W}t")
        )
        if (
            anchor
            and (anchor in own or anchor not in bookmarks)
            and sign in PERMALINK_SIGNS
            and not after.strip()
            and len(text) > len(sign)
            and text.endswith(sign)
        ):
            return text[: -len(sign)].rstrip()
    return text


def _is_list_item(paragraph: Any) -> bool:
    properties = paragraph._p.pPr  # numbering is a paragraph property python-docx keeps raw
    return (properties is not None and properties.numPr is not None) or (
        paragraph.style is not None and paragraph.style.name.startswith("List")
    )


def _table(out: TextBuilder, table: Any) -> None:
    rows = [_row_cells(row) for row in table.rows]
    if rows:
        out.table(rows[0], rows[1:])


def _row_cells(row: Any) -> list[str]:
    """The row's cells as the file holds them, each once: python-docx's ``row.cells`` lays
    them out on the grid (a cell spanning 10 million columns made 10 million), and a cell
    merged down from the row above is empty here (python-docx looks above for it, and raises
    when the first row says it continues one)."""
    return [" ".join(_Cell(tc, row).text.split()) for tc in row._tr.tc_lst]


def _footnotes(document: Any) -> list[str]:
    """The footnotes' texts (python-docx has no API for them: read from their part)."""
    for rel in document.part.rels.values():
        if rel.reltype.endswith("/footnotes") and not rel.is_external:
            element = rel.target_part.element if hasattr(rel.target_part, "element") else None
            if element is None:
                from lxml import etree

                parser = etree.XMLParser(resolve_entities=False, no_network=True)
                element = etree.fromstring(rel.target_part.blob, parser)
            notes = []
            for note in element.iter(f"{_W}footnote"):
                if note.get(f"{_W}type") in ("separator", "continuationSeparator"):
                    continue
                text = " ".join("".join(t.text or "" for t in note.iter(f"{_W}t")).split())
                if text:
                    notes.append(text)
            return notes
    return []
