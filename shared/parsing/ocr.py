"""Text from page images: Tesseract 5 (Debian's ``tesseract-ocr``, English model included; no
model is fetched at run time), run on each page as its command-line program, for uploaded PNG,
JPEG and TIFF images and for the pages of a PDF that have no usable text layer
(shared/parsing/pdf.py). (pytesseract, the usual wrapper, does the same but passes Tesseract
this process's whole environment, and its thread bound is wanted for Tesseract alone.)

OCR'd text is flagged ``ocr`` and ``doubtful_extraction``: the evidence policy answers
``verify`` when such a chunk is the only evidence, as for any doubtful extraction. A document is
OCR'd within ``ocr_max_pages`` pages and ``ocr_budget_s`` seconds (CONCORD_OCR_MAX_PAGES,
CONCORD_OCR_BUDGET_S): a 500-page scan does not hold a worker, and the pages past either bound
are named in the parse's notes (the job's ``parse_notes``), never dropped unsaid."""

from __future__ import annotations

import io
import os
import subprocess
import time
from collections.abc import Callable
from typing import Any

from shared.errors import ConcordError, ParseError
from shared.parsing.document import (
    DOUBTFUL_EXTRACTION,
    OCR,
    ParsedDocument,
    ParseOptions,
    Section,
)

OCR_FLAGS = (DOUBTFUL_EXTRACTION, OCR)
LANGUAGE = "eng"
# An image of more pixels than this is refused (Pillow's own guard against decompression
# bombs warns at 89 MP): an A4 page scanned at 600 dpi is 35 MP.
MAX_PIXELS = 60_000_000
# Below this width a page is scaled up before OCR: Tesseract reads text of 20-30 px capitals
# best, and a screenshot or a 100-dpi scan has less.
MIN_OCR_WIDTH = 1600


class OcrUnavailable(ConcordError):
    """Tesseract is not installed where the worker runs: the server's fault, not the
    upload's (no ParseError: the job is dead-lettered, and replayed once it is installed)."""


def parse_image(raw: bytes, options: ParseOptions) -> ParsedDocument:
    """An uploaded image (PNG, JPEG, or TIFF of one or more pages), a section per page."""
    image = open_image(raw)
    frames = getattr(image, "n_frames", 1)
    texts, notes = ocr_pages([(n, _frame_loader(image, n)) for n in range(1, frames + 1)], options)
    parts: list[str] = []
    sections: list[Section] = []
    offset = 0
    for number, text in texts:
        if not text:
            continue
        sections.append(Section(offset, f"page {number}" if frames > 1 else "", OCR_FLAGS))
        parts.append(text)
        offset += len(text) + 2
    return ParsedDocument("\n\n".join(parts), sections, notes)


def open_image(raw: bytes) -> Any:
    """The image, its size checked before its pixels are decoded."""
    from PIL import Image

    try:
        image = Image.open(io.BytesIO(raw))
    except Exception as e:  # Pillow raises UnidentifiedImageError, OSError, SyntaxError...
        raise ParseError(f"the image could not be read ({type(e).__name__}: {e})") from e
    _check_size(image)
    return image


class ImageTooLarge(ParseError):
    """A page image of more than MAX_PIXELS: an uploaded image is refused (for a TIFF, by
    its first page, at intake); a PDF page, or a later page of a TIFF, is left unread and
    named in the parse's notes."""


def check_pixels(width: int, height: int) -> None:
    """Refuse an image by the size it states, before its pixels are decoded."""
    if width * height > MAX_PIXELS:
        raise ImageTooLarge(
            f"the image is {width}x{height} pixels; the limit is {MAX_PIXELS:,} pixels a page"
        )


def _check_size(image: Any) -> None:
    check_pixels(*image.size)


def _frame_loader(image: Any, number: int) -> Callable[[], Any]:
    """Decodes page ``number`` of a (multi-page) image when called, its size checked first:
    only the pages OCR reads are ever decoded."""

    def load() -> Any:
        image.seek(number - 1)
        _check_size(image)  # each page states its own size
        return image.copy()

    return load


def ocr_pages(
    pages: list[tuple[int, Callable[[], Any]]], options: ParseOptions
) -> tuple[list[tuple[int, str]], list[str]]:
    """OCR ``pages`` ((page number, a loader of its image) pairs) in order within the
    document's bounds, each image decoded only when its turn comes: the text of each page
    read, and a note naming the pages left unread."""
    started = time.monotonic()
    texts: list[tuple[int, str]] = []
    notes: list[str] = []
    for count, (number, load) in enumerate(pages):
        spent = time.monotonic() - started
        if count >= options.ocr_max_pages or spent >= options.ocr_budget_s:
            unread = [n for n, _ in pages[count:]]
            why = (
                f"OCR reads the first {options.ocr_max_pages} of a document's pages "
                "(CONCORD_OCR_MAX_PAGES)"
                if count >= options.ocr_max_pages
                else f"OCR's {options.ocr_budget_s:.0f} s a document ran out (CONCORD_OCR_BUDGET_S)"
            )
            return texts, [*notes, f"{named_pages(unread)} not read: {why}"]
        try:
            image = load()
        except ImageTooLarge as e:  # its size refused before its pixels were decoded
            notes.append(f"page {number} not read: {e}")
            continue
        if image is None:
            continue  # a page with no image to read
        text = ocr_image(image, options.ocr_budget_s - spent)
        if text is None:  # the page alone outlasted what was left of the budget
            unread = [n for n, _ in pages[count:]]
            why = f"OCR's {options.ocr_budget_s:.0f} s a document ran out (CONCORD_OCR_BUDGET_S)"
            return texts, [*notes, f"{named_pages(unread)} not read: {why}"]
        texts.append((number, text))
    return texts, notes


# The Tesseract command; Debian's tesseract-ocr puts it on the PATH.
TESSERACT = "tesseract"


def ocr_size(width: int, height: int) -> tuple[int, int]:
    """The size a page is read at: scaled up to MIN_OCR_WIDTH, but never past MAX_PIXELS (a
    strip 100 pixels wide and 600,000 high is within it; 16 times wider, 15 GB)."""
    if width >= MIN_OCR_WIDTH:
        return width, height
    scale = min(MIN_OCR_WIDTH / width, (MAX_PIXELS / (width * height)) ** 0.5)
    if scale <= 1:
        return width, height
    return max(1, int(width * scale)), max(1, int(height * scale))


def ocr_image(image: Any, timeout_s: float) -> str | None:
    """The page's text (None when reading it took past ``timeout_s``)."""
    image = image.convert("L")  # grey: what Tesseract binarizes from anyway
    size = ocr_size(image.width, image.height)
    if size != image.size:
        image = image.resize(size)
    png = io.BytesIO()
    image.save(png, format="PNG")
    # Tesseract spreads a page over OpenMP threads: on cores the worker's processes already
    # share, that made OCR 5.8 times slower (bench/ocr.py, 0.10 against 0.60 pages/s). One
    # thread a page, set for the Tesseract process alone (in this process's environment it
    # would reach an OpenMP runtime started after it: torch's bf16 encoder then computed
    # garbage with its threads capped).
    environment = {**os.environ, "OMP_THREAD_LIMIT": "1"}
    try:
        done = subprocess.run(
            [TESSERACT, "stdin", "stdout", "-l", LANGUAGE],
            input=png.getvalue(),
            capture_output=True,
            timeout=max(1.0, timeout_s),
            env=environment,
            check=False,
        )
    except FileNotFoundError as e:
        raise OcrUnavailable(
            "the document needs OCR and Tesseract is not installed where the worker runs "
            "(apt-get install tesseract-ocr; scripts/setup.sh does)"
        ) from e
    except subprocess.TimeoutExpired:  # run() has killed it
        return None
    if done.returncode != 0:
        said = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise ParseError(f"OCR could not read a page ({said[-1] if said else done.returncode})")
    text = done.stdout.decode("utf-8", "replace")
    return "\n".join(line.rstrip() for line in text.splitlines()).strip()


def named_pages(numbers: list[int]) -> str:
    """Page numbers as a note names them: "page 4", "pages 2-5" or "7 pages"."""
    if len(numbers) == 1:
        return f"page {numbers[0]}"
    return (
        f"pages {numbers[0]}-{numbers[-1]}"
        if numbers == list(range(numbers[0], numbers[-1] + 1))
        else f"{len(numbers)} pages"
    )
