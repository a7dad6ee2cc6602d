"""A PDF's text layer by PDFium, in a process of its own: ``python -I pdfium_text.py`` reads
the PDF's bytes on standard input and writes JSON on standard output: ``{"pages": [...],
"unread": [page numbers PDFium could not load], "error": null}``, or ``"error"`` a message a
person can act on.

A process of its own because PDFium is C: a page drawing forms within forms (2.5 KB, eight
levels, each drawing the next ten times) took 27 s and 8 GB inside one call, which neither a
task's soft time limit (a signal handled between Python bytecodes) nor Python's MemoryError
can stop; the worker lost its whole batch. Here the process's address space is bounded, and
the parent (shared/parsing/pdf.py) bounds its time. Imports nothing of Concord's: it starts in
a tenth of a second.
"""

from __future__ import annotations

import json
import resource
import sys

# Address space of this process: PDFium's largest real documents here needed under 300 MB.
MEMORY_BYTES = 2 * 1024**3


def main() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    raw = sys.stdin.buffer.read()
    json.dump(read(raw), sys.stdout)


def read(raw: bytes) -> dict[str, object]:
    import pypdfium2 as pdfium
    import pypdfium2.raw as pdfium_c

    try:
        document = pdfium.PdfDocument(raw)
    except pdfium.PdfiumError as e:
        code = getattr(e, "err_code", None)
        if code in (pdfium_c.FPDF_ERR_PASSWORD, pdfium_c.FPDF_ERR_SECURITY):
            return {"error": "the PDF is password-protected: upload it without a password"}
        if code == pdfium_c.FPDF_ERR_SUCCESS:  # pypdfium2 refuses a document of no pages so
            return {"error": "the PDF has no pages"}
        return {"error": f"the PDF could not be read (PdfiumError: {e})"}
    pages: list[str] = []
    unread: list[int] = []
    try:
        for index in range(len(document)):
            try:
                page = document[index]
            except pdfium.PdfiumError:  # a page the page tree names but PDFium cannot load
                pages.append("")
                unread.append(index + 1)
                continue
            text_page = page.get_textpage()
            pages.append(text_page.get_text_range())
            text_page.close()
            page.close()
    finally:
        document.close()
    if not pages:
        return {"error": "the PDF has no pages"}
    return {"pages": pages, "unread": unread, "error": None}


if __name__ == "__main__":
    main()
