"""PowerPoint (.pptx), read by python-pptx: a section per slide, its title as the heading
("Slide 3: Results"), the text of its shapes in their order (a paragraph a block, a short
paragraph bold throughout a subheading, groups opened, tables a row at a time under their
header row), then its speaker notes under "Speaker notes"."""

from __future__ import annotations

import io
from typing import Any

from shared.errors import ParseError
from shared.parsing.containers import without_macros
from shared.parsing.document import ParsedDocument, ParseOptions, TextBuilder

# Slides of one deck: a deck of more is refused (each slide is a section; 5,000 of them
# would be a dump of something, and would hold a worker for minutes).
MAX_SLIDES = 2000


def parse(raw: bytes, options: ParseOptions) -> ParsedDocument:
    from pptx import Presentation

    raw = without_macros(raw)  # checked (open_zip) before python-pptx inflates anything
    try:
        deck = Presentation(io.BytesIO(raw))
    except Exception as e:  # python-pptx raises KeyError, ValueError, lxml errors
        raise ParseError(f"the slide deck could not be read ({type(e).__name__}: {e})") from e
    if len(deck.slides) > MAX_SLIDES:
        raise ParseError(f"the deck has {len(deck.slides)} slides; the limit is {MAX_SLIDES}")
    out = TextBuilder(headings_in_text=True)
    for number, slide in enumerate(deck.slides, start=1):
        title_shape = slide.shapes.title
        title = " ".join(title_shape.text_frame.text.split()) if title_shape is not None else ""
        out.heading(1, f"Slide {number}: {title}" if title else f"Slide {number}")
        for shape in slide.shapes:
            if title_shape is None or shape.shape_id != title_shape.shape_id:
                _shape(out, shape)
        if slide.has_notes_slide:
            notes = slide.notes_slide.notes_text_frame
            if notes is not None and notes.text.strip():
                out.heading(2, "Speaker notes")
                out.paragraph(notes.text)
    return out.build()


def _shape(out: TextBuilder, shape: Any) -> None:
    if shape.shape_type is not None and getattr(shape, "shapes", None) is not None:
        for inner in shape.shapes:  # a group
            _shape(out, inner)
    elif getattr(shape, "has_table", False) and shape.has_table:
        rows = [[cell.text for cell in row.cells] for row in shape.table.rows]
        if rows:
            out.table(rows[0], rows[1:])
    elif getattr(shape, "has_text_frame", False) and shape.has_text_frame:
        # A paragraph a block, as a document's (a deck made from a document puts a section's
        # paragraphs on one slide, a frame of many; a line break inside one is a vertical
        # tab). A short paragraph bold throughout is a subheading (pandoc's decks make a
        # document's subheadings so): its slide's section under it, its line kept in the text.
        for paragraph in shape.text_frame.paragraphs:
            text = paragraph.text.replace("\x0b", "\n")
            if _subheading(paragraph, text):
                out.heading(2, text)
            else:
                out.paragraph(text)


# Words a bold paragraph may have and still be a subheading (not a bold sentence of the text).
SUBHEADING_MAX_WORDS = 12


def _subheading(paragraph: Any, text: str) -> bool:
    runs = [run for run in paragraph.runs if run.text.strip()]
    return (
        bool(runs)
        and all(run.font.bold for run in runs)
        and len(text.split()) <= SUBHEADING_MAX_WORDS
    )
