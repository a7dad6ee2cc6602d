"""The files that are archives underneath: Office Open XML (docx, pptx, xlsx), OpenDocument
(odt, odp, ods) and EPUB are ZIP archives of XML; Outlook's .msg and password-protected Office
files are OLE compound files. Here: what such a file is, decided from its members (never from its
name), and the checks every one passes before a library opens it.

A ZIP archive is read from its central directory, which states each member's sizes, before any
member is inflated:

* a zip bomb is refused by the sizes it states (the total, and the ratio of inflated to
  compressed bytes); members are then inflated with a cap at their stated size, so an archive
  whose directory lies cannot inflate more;
* a member name that is absolute or climbs out (``..``) is refused: no library here writes
  members to disk, but a name like that is never a real document's;
* an encrypted member, or an Office file encrypted as a whole (an OLE file holding an
  ``EncryptedPackage``), is refused with what to do: it cannot be read without its password;
* an XML member that declares entities (``<!ENTITY``: the "billion laughs") is refused, as
  intake refuses it in text formats. No Office, OpenDocument or EPUB writer declares any.

Macros (``vbaProject.bin`` in a .docm/.xlsm/.pptm) are never run: ``without_macros`` drops
them before a library opens the file, which is then read as the plain document it also is.
"""

from __future__ import annotations

import io
import re
import zipfile

from shared.errors import ParseError, UnsupportedMediaType

ZIP_SIGNATURE = b"PK\x03\x04"
OLE_SIGNATURE = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"

# Bounds of what an archive may inflate to: a real document of hundreds of pages is a few
# MB of XML; its XML compresses 5-20 times (a sheet of repeated cells up to ~100).
MAX_MEMBERS = 10_000
MAX_INFLATED_BYTES = 256 * 1024 * 1024
MAX_RATIO = 200  # inflated / compressed, for an archive that inflates past RATIO_FROM_BYTES
RATIO_FROM_BYTES = 16 * 1024 * 1024

# "<!ENTITY" in UTF-8 (and ASCII) and in UTF-16 of either byte order, the encodings XML may use.
_ENTITY_DECLARATION = re.compile(
    b"|".join(
        re.escape(word.encode(encoding))
        for word in ("<!ENTITY", "<!entity")
        for encoding in ("ascii", "utf-16-le", "utf-16-be")
    )
)
_XML_MEMBERS = (".xml", ".rels", ".xhtml", ".html", ".htm", ".opf", ".ncx", ".svg")

# The content type each kind of archive is, told by its members.
_OPEN_XML_MAIN = {
    "word/document.xml": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    "ppt/presentation.xml": (
        "application/vnd.openxmlformats-officedocument.presentationml.presentation"
    ),
    "xl/workbook.xml": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
}
# An OpenDocument file or an EPUB names its own type in a first member called "mimetype".
_NAMED_TYPES = {
    "application/vnd.oasis.opendocument.text",
    "application/vnd.oasis.opendocument.presentation",
    "application/vnd.oasis.opendocument.spreadsheet",
    "application/epub+zip",
}


def zip_content_type(raw: bytes) -> str | None:
    """The supported document type a ZIP archive holds, from its members; None when it is
    another kind of archive (or none that can be read)."""
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as archive:
            names = set(archive.namelist())
            if "mimetype" in names:
                info = archive.getinfo("mimetype")
                if info.file_size <= 100:
                    named = archive.read(info).decode("ascii", "replace").strip()
                    if named in _NAMED_TYPES:
                        return named
            for member, content_type in _OPEN_XML_MAIN.items():
                if member in names:
                    return content_type
    except Exception:  # zipfile, zlib and codecs raise many kinds on a broken archive
        return None  # screening says why it cannot be read
    return None


def stated_inflated_bytes(raw: bytes) -> int:
    """What an archive's directory says its members inflate to (0 for no readable archive:
    its parser then fails on it without inflating anything)."""
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as archive:
            return sum(info.file_size for info in archive.infolist())
    except Exception:  # zipfile raises many kinds on a broken archive
        return 0


def check_zip(raw: bytes) -> None:
    """Refuse an archive that is a bomb, names a path outside itself, is encrypted, or holds
    XML that declares entities (module docstring)."""
    with open_zip(raw) as archive:
        for info in archive.infolist():
            if info.filename.lower().endswith(_XML_MEMBERS) and _ENTITY_DECLARATION.search(
                read_member(archive, info)
            ):
                raise ParseError(
                    f"the archive's {info.filename} declares XML entities, which are refused "
                    "(entity expansion attacks)"
                )


def open_zip(raw: bytes) -> zipfile.ZipFile:
    """The archive, its directory checked (module docstring); a ParseError or
    UnsupportedMediaType says why one is refused."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(raw))
    except Exception as e:  # BadZipFile, LargeZipFile, ValueError, UnicodeDecodeError...
        raise ParseError(f"the file is not a readable ZIP archive ({type(e).__name__}: {e})") from e
    infos = archive.infolist()
    if len(infos) > MAX_MEMBERS:
        raise ParseError(f"the archive has {len(infos)} members; the limit is {MAX_MEMBERS}")
    inflated = sum(info.file_size for info in infos)
    compressed = max(1, sum(info.compress_size for info in infos))
    if inflated > MAX_INFLATED_BYTES:
        raise ParseError(
            f"the archive inflates to {inflated} bytes; the limit is {MAX_INFLATED_BYTES} "
            "(a zip bomb, or a document far larger than any real one)"
        )
    if inflated > RATIO_FROM_BYTES and inflated / compressed > MAX_RATIO:
        raise ParseError(
            f"the archive inflates {inflated / compressed:.0f} times; the limit is {MAX_RATIO} "
            "(a zip bomb)"
        )
    for info in infos:
        name = info.filename.replace("\\", "/")
        if name.startswith("/") or ".." in name.split("/") or re.match(r"[A-Za-z]:", name):
            raise ParseError(f"the archive has a member named {info.filename!r}, outside itself")
        if info.flag_bits & 0x1:
            raise UnsupportedMediaType(
                "the file is encrypted (password-protected); save it without a password and "
                "upload it again"
            )
    return archive


def read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes:
    """A member's bytes, inflating no more than its stated size (the directory may lie); a
    member that cannot be inflated (a bad CRC, a broken deflate stream, a method zipfile
    lacks) is a ParseError."""
    try:
        with archive.open(info) as member:
            data = member.read(info.file_size + 1)
    except Exception as e:  # BadZipFile, zlib.error, NotImplementedError, EOFError, OSError
        raise ParseError(
            f"the archive's {info.filename} cannot be read ({type(e).__name__}: {e})"
        ) from e
    if len(data) > info.file_size:
        raise ParseError(f"the archive's {info.filename} inflates past its stated size")
    return data


OUTLOOK_MESSAGE = "application/vnd.ms-outlook"


def ole_content_type(raw: bytes) -> str | None:
    """What an OLE compound file is, told by its streams: an Outlook message (its property
    stream and MAPI property streams), or None. An Office file encrypted as a whole holds
    the encrypted package: refused with what to do. Other OLE files (old binary .doc, .xls,
    .ppt) are left to screening, which refuses them as a kind Concord does not read."""
    import olefile

    try:
        with olefile.OleFileIO(raw) as ole:
            streams = {"/".join(entry) for entry in ole.listdir(streams=True, storages=True)}
    except (OSError, ValueError, IndexError):
        return None  # not readable as OLE: screening refuses it by its signature
    if "EncryptedPackage" in streams or "EncryptionInfo" in streams:
        raise UnsupportedMediaType(
            "the file is an encrypted (password-protected) Office document; save it without a "
            "password and upload it again"
        )
    if "__properties_version1.0" in streams and any(s.startswith("__substg1.0_") for s in streams):
        return OUTLOOK_MESSAGE
    return None


# Office's macro-enabled main parts, and the plain ones the libraries open.
_MACRO_MAIN_TYPES = {
    b"application/vnd.ms-word.document.macroEnabled.main+xml": (
        b"application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"
    ),
    b"application/vnd.ms-powerpoint.presentation.macroEnabled.main+xml": (
        b"application/vnd.openxmlformats-officedocument.presentationml.presentation.main+xml"
    ),
    b"application/vnd.ms-excel.sheet.macroEnabled.main+xml": (
        b"application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml"
    ),
}


def without_macros(raw: bytes) -> bytes:
    """An Office file with macros (.docm, .pptm, .xlsm) as the plain document it also is: its
    macro project left out, its main part's type the plain one (python-docx and python-pptx
    open no other). Any other file comes back as it was."""
    with open_zip(raw) as archive:
        try:
            types = read_member(archive, archive.getinfo("[Content_Types].xml"))
        except KeyError as e:
            raise ParseError("the archive has no [Content_Types].xml: it is no Office file") from e
        if not any(macro in types for macro in _MACRO_MAIN_TYPES):
            return raw
        for macro, plain in _MACRO_MAIN_TYPES.items():
            types = types.replace(macro, plain)
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as plain_file:
            for info in archive.infolist():
                if info.filename.lower().endswith("vbaproject.bin"):
                    continue
                data = (
                    types if info.filename == "[Content_Types].xml" else read_member(archive, info)
                )
                plain_file.writestr(info.filename, data)
    return buffer.getvalue()
