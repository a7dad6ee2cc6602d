"""A PDF's text layer by PDFium, in a process of its own that reads one PDF after another
(shared/parsing/pdfium_reader.py starts it as ``python -I _pdfium_child.py MEMORY_MB
MAX_CHARS`` and keeps it). On standard input each PDF comes as an 8-byte length and its bytes;
on standard output each answer goes back the same way, JSON: ``{"pages": [...], "unread":
[page numbers PDFium could not read], "error": null}``, or ``"error"`` a message a person can
act on. It ends at the end of its input.

A process of its own because PDFium is C: a page drawing forms within forms (2.5 KB, eight
levels, each drawing the next ten times) took 27 s and 8 GB inside one call, which neither a
task's soft time limit (a signal handled between Python bytecodes) nor Python's MemoryError
can stop; the worker lost its whole batch. Here the address space is bounded, the parent
bounds the time. ``-I`` keeps the worker's environment out and this folder off the path (its
html.py would shadow the standard library's). Kept from one PDF to the next because starting
it costs 44 ms (the interpreter, pypdfium2's import), more than reading a short PDF. Not a
format of the registry: the underscore says so.
"""

from __future__ import annotations

import json
import resource
import sys
from typing import Any

LENGTH_BYTES = 8


def main() -> None:
    memory_mb, max_chars = int(sys.argv[1]), int(sys.argv[2])
    limit = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    requests, answers = sys.stdin.buffer, sys.stdout.buffer
    while True:
        raw = _message(requests)
        if raw is None:
            return
        answer = json.dumps(read(raw, max_chars)).encode()  # ASCII: ensure_ascii
        answers.write(len(answer).to_bytes(LENGTH_BYTES, "big") + answer)
        answers.flush()


def _message(stream: Any) -> bytes | None:
    """The next length-prefixed message, or None at the end of the input."""
    head = stream.read(LENGTH_BYTES)
    if len(head) < LENGTH_BYTES:
        return None
    return bytes(stream.read(int.from_bytes(head, "big")))


_LOAD_ERRORS = {
    1: "an unknown error",
    2: "file not found",
    3: "not a PDF, or a damaged one",
    6: "a page is missing",
}


def read(raw: bytes, max_chars: int) -> dict[str, object]:
    import pypdfium2 as pdfium
    import pypdfium2.raw as pdfium_c

    # Opened through PDFium's own call, not PdfDocument(bytes): that refuses a document of no
    # pages with the error of the last load that failed (a password three PDFs before), and
    # does not close it. ``raw`` outlives the document: PDFium reads it in place.
    handle = pdfium_c.FPDF_LoadMemDocument64(raw, len(raw), None)
    if not handle:
        code = pdfium_c.FPDF_GetLastError()  # this load's
        if code in (pdfium_c.FPDF_ERR_PASSWORD, pdfium_c.FPDF_ERR_SECURITY):
            return {"error": "the PDF is password-protected: upload it without a password"}
        why = _LOAD_ERRORS.get(code, f"PDFium's error {code}")
        return {"error": f"the PDF could not be read ({why})"}
    if pdfium_c.FPDF_GetPageCount(handle) < 1:
        pdfium_c.FPDF_CloseDocument(handle)
        return {"error": "the PDF has no pages"}
    document = pdfium.PdfDocument(handle)
    pages: list[str] = []
    unread: list[int] = []
    chars = 0
    try:
        for index in range(len(document)):
            try:  # a page the page tree names but PDFium cannot load or read
                page = document[index]
                text_page = page.get_textpage()
                text = text_page.get_text_range()
                text_page.close()
                page.close()
            except pdfium.PdfiumError:
                text = ""
                unread.append(index + 1)
            chars += len(text)
            if chars > max_chars:
                return {
                    "error": f"the PDF's text is over {max_chars:,} characters "
                    "(CONCORD_PDF_TEXT_MAX_CHARS)"
                }
            pages.append(text)
    finally:
        document.close()
    return {"pages": pages, "unread": unread, "error": None}


if __name__ == "__main__":
    main()
