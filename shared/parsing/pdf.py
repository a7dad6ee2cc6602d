"""PDF with a text layer, read by PDFium (pypdfium2) in a bounded process of its own
(shared/parsing/_pdfium_child.py): a section per page, running headers and footers left out,
typesetting's broken words joined; a scanned page's image, found by pypdf, read by OCR.

PDFium rather than pypdf for the text layer: pypdf split words that groff and TeX set with
kerning ("k ey", "v alidity", "-Voption"), which neither search arm then matched; PDFium keeps
most of them whole, in less time (docs/evaluation-and-benchmarks.md has the comparison)."""

from __future__ import annotations

import io
import re
import signal
import unicodedata
from collections import Counter
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from shared.errors import ConcordError, ParseError
from shared.parsing.document import DOUBTFUL_EXTRACTION, ParsedDocument, ParseOptions, Section
from shared.parsing.ocr import OCR_FLAGS, ImageTooLarge, check_pixels, named_pages, ocr_pages
from shared.parsing.pdfium_reader import READER, ReaderEnded, ReaderTimedOut, ReaderUnavailable
from shared.retry import is_retriable

# A page whose text layer holds fewer letters and digits than this (a scan with a page
# number, a figure with a caption) or is mostly not letters (a font without a usable encoding
# extracts as symbols) is text to check before use: its chunks carry DOUBTFUL_EXTRACTION.
THIN_PAGE_CHARS = 100
MIN_LETTER_SHARE = 0.5
# A page of fewer letters and digits than this that holds an image is a scan: OCR reads it. (A
# figure's page with a caption has more: its caption is kept, flagged as a thin page.)
SCAN_CHARS = 20


def parse(raw: bytes, options: ParseOptions) -> ParsedDocument:
    """A section per page; a page without a text layer (a scan: fewer than ``SCAN_CHARS``
    letters and digits, a page number at most) is read from its image by OCR."""
    pages, unread = _text_layer(raw, options)
    pages = [_pdf_text(page) for page in pages]
    running = _running_lines(pages)
    pages = [_without_running_lines(page, running).strip() for page in pages]
    read_by_ocr, notes = _ocr_scanned_pages(raw, pages, options)
    if unread:
        notes = [
            f"{named_pages(unread)} not read: PDFium could not read their page objects",
            *notes,
        ]
    parts: list[str] = []
    sections: list[Section] = []
    offset = 0
    for number, page_text in enumerate(pages, start=1):
        flags: tuple[str, ...]
        if number in read_by_ocr:
            page_text, flags = read_by_ocr[number], OCR_FLAGS
        else:
            flags = _page_flags(page_text)
        if not page_text:
            continue
        sections.append(Section(offset, f"page {number}", flags))
        parts.append(page_text)
        offset += len(page_text) + 2
    if not parts:
        why = f" ({'; '.join(notes)})" if notes else ""
        raise ParseError(f"the PDF has no text layer, and OCR read no text on its pages{why}")
    return ParsedDocument("\n\n".join(parts), sections, notes)


class PdfiumUnavailable(ConcordError):
    """pypdfium2 is not installed where the worker runs: the server's fault, not the
    upload's (no ParseError: the job is dead-lettered, and replayed once it is installed)."""


def _text_layer(raw: bytes, options: ParseOptions) -> tuple[list[str], list[int]]:
    """Each page's text as PDFium extracts it, lines ending in "\n", and the numbers of the
    pages PDFium could not read (their text empty), read by the process's PDFium reader
    within the options' bounds (_pdfium_child.py says why it is a process of its own); past
    one, the file's ParseError. PDFium joins a word hyphenated at a line's end and marks the
    place with U+FFFE ("prece\ufffedence", "GPL\ufffe3"): the mark becomes the hyphen and
    line end it was, which ``_pdf_text`` joins only where both sides are lowercase."""
    try:
        result = READER.read(
            raw, options.pdf_text_memory_mb, options.pdf_text_max_chars, options.pdf_text_timeout_s
        )
    except ReaderTimedOut:
        raise ParseError(
            f"the PDF's text layer was not read within {options.pdf_text_timeout_s:.0f} s "
            "(CONCORD_PDF_TEXT_TIMEOUT_S): a page that draws forms within forms, or one too "
            "complex to read"
        ) from None
    except ReaderEnded as e:
        raise _child_failure(e.returncode, e.stderr, options) from None
    except ReaderUnavailable as e:
        raise PdfiumUnavailable(str(e)) from e
    if result["error"]:
        raise ParseError(result["error"])
    pages = [
        page.replace("\r\n", "\n").replace("\r", "\n").replace("\ufffe", "-\n")
        for page in result["pages"]
    ]
    return pages, result["unread"]


# Signals a reader gets from a person or a supervisor (its memory bound kills it with SIGKILL
# or SIGABRT, PDFium's own failure with SIGSEGV or SIGABRT).
_STOPPING_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


def _child_failure(returncode: int, stderr: bytes, options: ParseOptions) -> Exception:
    """What a failed child says: out of its memory (killed by a signal, or a MemoryError),
    PDFium missing (the server's fault), or the reader's own last line."""
    stderr_lines = stderr.decode("utf-8", "replace").strip().splitlines()
    last = stderr_lines[-1] if stderr_lines else ""
    if "ModuleNotFoundError" in last:
        return PdfiumUnavailable(f"PDFs cannot be read where the worker runs: {last}")
    if -returncode in _STOPPING_SIGNALS:  # someone stopped the reader: not the file's doing
        return PdfiumUnavailable(f"the PDF reader was stopped by signal {-returncode}")
    if returncode < 0 or "MemoryError" in last:
        ended = f"signal {-returncode}" if returncode < 0 else "MemoryError"
        return ParseError(
            f"the PDF's text layer could not be read within {options.pdf_text_memory_mb} MB "
            f"(CONCORD_PDF_TEXT_MEMORY_MB; the reader ended by {ended}): a page that draws "
            "forms within forms, or one too complex to read"
        )
    return ParseError(f"the PDF could not be read ({last or f'status {returncode}'})")


def _ocr_scanned_pages(
    raw: bytes, pages: list[str], options: ParseOptions
) -> tuple[dict[int, str], list[str]]:
    """page number -> its text by OCR, for the pages whose text layer is thin (a scan) where
    OCR reads more than the layer held; and the notes of pages left unread. A page's image
    is decoded only when OCR comes to it, within the document's bounds. pypdf finds the
    images (opened only where a page is thin): it states an image's size before decoding it."""
    thin = [
        n for n, page_text in enumerate(pages, start=1) if _alphanumeric(page_text) < SCAN_CHARS
    ]
    if not thin or options.ocr_max_pages <= 0:
        return {}, []
    from pypdf import PdfReader

    try:  # pypdf reads pages lazily: the page tree is walked here, inside the try
        reader = PdfReader(io.BytesIO(raw))
        if len(reader.pages) != len(pages):  # not the same pages: an image could be misplaced
            return {}, [f"{named_pages(thin)} not read by OCR: the PDF's page tree is inconsistent"]
        scans = [
            (number, _largest_image_loader(reader.pages[number - 1]))
            for number in thin
            if _has_images(reader.pages[number - 1])
        ]
    except Exception as e:  # PDFium read the text layer; pypdf cannot find the images
        if is_retriable(e):
            raise
        return {}, [
            f"{named_pages(thin)} not read by OCR: "
            f"their images could not be found ({type(e).__name__})"
        ]
    if not scans:
        return {}, []
    texts, notes = ocr_pages(scans, options)
    better = {
        number: text
        for number, text in texts
        if _alphanumeric(text) > _alphanumeric(pages[number - 1])
    }
    return better, notes


def _has_images(page: Any) -> bool:
    """Whether the page draws any image (read from its resources; nothing is decoded)."""
    try:
        resources: Any = page.get("/Resources")
        objects: Any = resources.get_object().get("/XObject") if resources else None
        return objects is not None and any(
            found.get_object().get("/Subtype") == "/Image"
            for found in objects.get_object().values()
        )
    except Exception as e:  # a page pypdf cannot describe is left as its text layer has it
        if is_retriable(e):
            raise
        return False


def _largest_image_loader(page: Any) -> Callable[[], Any]:
    """Decodes the page's largest image (a scan's page is one) when called, or gives None.
    Only that image is decoded, and only once the size it states is within MAX_PIXELS
    (``ImageTooLarge`` otherwise): pypdf's ``page.images`` decodes every image of a page, a
    stream stating 100,000 pixels square among them (10 GB), before any size is known. The
    decoded size is checked again (a JPEG may hold more than its stream states)."""

    def load() -> Any:
        images = _page_images(page)
        if not images:
            return None
        width, height, largest = max(images, key=lambda found: found[0] * found[1])
        check_pixels(width, height)
        try:
            image = largest.decode_as_image()
        except Exception as e:  # an image pypdf cannot decode leaves the page as its layer has it
            if is_retriable(e):  # the task's time limit, memory: the job's, not the page's
                raise
            return None
        if image is not None:
            check_pixels(*image.size)
        return image

    return load


# Form XObjects nest: how deep a page's images are looked for, and how many XObjects in all.
MAX_FORM_DEPTH = 4
MAX_PAGE_XOBJECTS = 1000


def _page_images(page: Any) -> list[tuple[int, int, Any]]:
    """The page's images (in its resources and those of the forms it draws), each with the
    width and height it states; nothing decoded. Each XObject is visited once, and at most
    MAX_PAGE_XOBJECTS of them (a form drawing itself a hundred times over is a few KB). An
    inline image (``BI ... EI`` in a content stream) is not read. ``ImageTooLarge`` where the
    sizes cannot be known: an image without a size, resources pypdf cannot read (the page is
    then left unread, its text layer kept)."""
    images: list[tuple[int, int, Any]] = []
    visited: set[Any] = set()

    def visit(resources: Any, depth: int) -> None:
        objects: Any = resources.get_object().get("/XObject") if resources else None
        if objects is None or depth > MAX_FORM_DEPTH:
            return
        for reference in objects.get_object().values():
            key = getattr(reference, "idnum", None) or id(reference)
            if key in visited:
                continue
            visited.add(key)
            if len(visited) > MAX_PAGE_XOBJECTS:
                raise ImageTooLarge(f"the page draws more than {MAX_PAGE_XOBJECTS} objects")
            found = reference.get_object()
            if found.get("/Subtype") == "/Image":
                width, height = _number(found, "/Width"), _number(found, "/Height")
                if width is None or height is None:
                    raise ImageTooLarge("an image of the page states no size")
                images.append((width, height, found))
            else:  # a form, or a stream pypdf would read as one
                visit(found.get("/Resources"), depth + 1)

    try:
        visit(page.get("/Resources"), 0)
    except ImageTooLarge:
        raise
    except Exception as e:  # resources pypdf cannot read: nothing is decoded from them
        if is_retriable(e):
            raise
        raise ImageTooLarge(f"the page's images could not be described ({type(e).__name__})") from e
    return images


def _number(stream: Any, key: str) -> int | None:
    value = stream.get(key)
    value = value.get_object() if hasattr(value, "get_object") else value
    return int(value) if isinstance(value, int) else None


def _alphanumeric(text: str) -> int:
    return sum(1 for c in text if c.isalnum())


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
