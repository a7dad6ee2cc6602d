"""A PDF's text layer by PDFium, in a process of its own (shared/parsing/pdf.py starts it as
``python -I _pdfium_child.py MEMORY_MB MAX_CHARS``): it reads the PDF's bytes on standard
input and writes JSON on standard output, ``{"pages": [...], "unread": [page numbers PDFium
could not read], "error": null}``, or ``"error"`` a message a person can act on.

A process of its own because PDFium is C: a page drawing forms within forms (2.5 KB, eight
levels, each drawing the next ten times) took 27 s and 8 GB inside one call, which neither a
task's soft time limit (a signal handled between Python bytecodes) nor Python's MemoryError
can stop; the worker lost its whole batch. Here the address space is bounded, the parent
bounds the time. ``-I`` keeps the worker's environment out and this folder off the path (its
html.py would shadow the standard library's). Imports nothing of Concord's: it starts in a
tenth of a second. Not a format of the registry: the underscore says so.
"""

from __future__ import annotations

import json
import resource
import sys


def main() -> None:
    memory_mb, max_chars = int(sys.argv[1]), int(sys.argv[2])
    limit = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    json.dump(read(sys.stdin.buffer.read(), max_chars), sys.stdout)


def read(raw: bytes, max_chars: int) -> dict[str, object]:
    import pypdfium2 as pdfium
    import pypdfium2.raw as pdfium_c

    try:
        document = pdfium.PdfDocument(raw)
    except pdfium.PdfiumError as e:
        code = getattr(e, "err_code", None)
        if code in (pdfium_c.FPDF_ERR_PASSWORD, pdfium_c.FPDF_ERR_SECURITY):
            return {"error": "the PDF is password-protected: upload it without a password"}
        if code == pdfium_c.FPDF_ERR_SUCCESS:  # how pypdfium2 refuses a document of no pages
            return {"error": "the PDF has no pages"}
        return {"error": f"the PDF could not be read (PdfiumError: {e})"}
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
