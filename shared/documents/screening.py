"""Intake screening: refuse at the door what can never be parsed safely, before it is stored.

The content type is decided by the bytes, not by the client's header or file name: known binary
formats (archives, images, executables, old binary Office files) are refused whatever they claim
to be, text kinds must be text (no NUL bytes), a PDF must start with ``%PDF-`` and open as a PDF,
and documents that declare XML entities (the "billion laughs" expansion) are refused. The
document formats that are ZIP archives (Office Open XML, OpenDocument, EPUB) pass the archive's
checks instead (shared/parsing/containers.py: zip bombs, paths out of the archive, encryption,
entities in any XML member). A file name is
a name, never a path. What passes here can still fail to parse in the worker; that job then
fails with its reason."""

from __future__ import annotations

import io
import re

from shared.errors import BadRequest, ParseError, UnsupportedMediaType
from shared.parsing import SUPPORTED_TYPES, containers, resolve_content_type
from shared.parsing.ocr import open_image
from shared.parsing.registry import BY_CONTENT_TYPE

# (signature at offset 0, what it is)
BINARY_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (
        b"PK\x03\x04",
        "a ZIP archive that is no Word, PowerPoint, Excel, OpenDocument or EPUB document",
    ),
    (b"PK\x05\x06", "an empty ZIP archive"),
    (b"\x1f\x8b", "a gzip file"),
    (b"BZh", "a bzip2 file"),
    (b"\xfd7zXZ\x00", "an xz file"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive"),
    (b"Rar!\x1a\x07", "a RAR archive"),
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF87a", "a GIF image"),
    (b"GIF89a", "a GIF image"),
    (b"\x7fELF", "an ELF executable"),
    (
        b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1",
        "an OLE file (an old binary .doc, .xls or .ppt: save it as .docx, .xlsx or .pptx)",
    ),
    (b"\xca\xfe\xba\xbe", "a Java class or Mach-O file"),
)
_ENTITY_DECLARATION = re.compile(rb"<!ENTITY", re.IGNORECASE)
_UNSAFE_NAME = re.compile(r"[/\\\x00-\x1f\x7f]|^\.{1,2}$")


def check_filename(filename: str | None) -> None:
    if filename is not None and (_UNSAFE_NAME.search(filename) or ".." in filename):
        raise BadRequest(
            "the file name must be a plain name (no path separators, '..' or control characters)"
        )


def screen_upload(raw: bytes, content_type: str, filename: str | None = None) -> None:
    check_filename(filename)
    container = BY_CONTENT_TYPE[content_type].container if content_type in BY_CONTENT_TYPE else None
    if container == "zip" and raw.startswith(containers.ZIP_SIGNATURE):
        containers.check_zip(raw)
        held = containers.zip_content_type(raw)
        if held != content_type:  # the archive's members say what it is, not the upload
            raise UnsupportedMediaType(
                f"declared as {SUPPORTED_TYPES[content_type]}, but the archive is "
                + (
                    f"a {SUPPORTED_TYPES[held]} file"
                    if held
                    else "no Word, PowerPoint, Excel, OpenDocument or EPUB document"
                )
            )
        return
    if container == "ole":
        if not (
            raw.startswith(containers.OLE_SIGNATURE)
            and containers.ole_content_type(raw) == content_type
        ):
            raise UnsupportedMediaType(
                f"declared as {SUPPORTED_TYPES[content_type]} ({content_type}), but the file is "
                "not an Outlook message (an OLE file with a message's properties)"
            )
        return
    if container == "image" and content_type == resolve_content_type(None, None, raw):
        open_image(raw)  # its header read, its size checked: the worker decodes it for OCR
        return
    if container is not None:
        named = SUPPORTED_TYPES[content_type]
        what = "a ZIP archive, as" if container == "zip" else "a PNG, JPEG or TIFF image, as"
        raise UnsupportedMediaType(
            f"declared as {named} ({content_type}), but the file is not {what} every {named} "
            "file is"
        )
    head = raw[:16]
    for signature, what in BINARY_SIGNATURES:
        if head.startswith(signature):
            raise UnsupportedMediaType(f"the file is {what}, which Concord does not index")
    if head.startswith(b"MZ") and b"\x00" in raw[:64]:
        raise UnsupportedMediaType("the file is a Windows executable")
    kind = SUPPORTED_TYPES.get(content_type)
    if kind == "pdf":
        _check_pdf(raw)
        return
    if b"\x00" in raw:
        raise UnsupportedMediaType(f"the file has NUL bytes, so it is not {content_type} text")
    if _ENTITY_DECLARATION.search(raw):
        raise ParseError(
            "documents that declare XML/DTD entities are refused (entity expansion attacks)"
        )


def _check_pdf(raw: bytes) -> None:
    from pypdf import PdfReader
    from pypdf.errors import FileNotDecryptedError

    if not raw.startswith(b"%PDF-"):
        raise UnsupportedMediaType("declared as a PDF, but the file does not start with %PDF-")
    try:
        pages = len(PdfReader(io.BytesIO(raw)).pages)
    except FileNotDecryptedError as e:  # a user password (an owner password alone leaves the
        # file readable: such a PDF is read as it is)
        raise ParseError("the PDF is password-protected: upload it without a password") from e
    except Exception as e:  # pypdf raises many types on hostile input; all mean "not a PDF"
        raise ParseError(f"the PDF could not be read ({type(e).__name__})") from e
    if pages == 0:
        raise ParseError("the PDF has no pages")
