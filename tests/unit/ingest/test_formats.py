"""The document formats of shared/parsing/ on real files made by independent tools
(tests/data/formats/make.sh: pandoc, LibreOffice, msoffcrypto-tool, Python's email package), and
the hostile archives every ZIP-based format is screened for. No services."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest

from shared.documents.screening import screen_upload
from shared.errors import ParseError, UnsupportedMediaType
from shared.ingest.chunking import Chunker
from shared.parsing import TABLE, parse, resolve_content_type, spreadsheets
from shared.parsing import slides as slides_module
from tests.helpers import pdf_of
from tests.unit.ingest.test_parsing_and_chunking import word_offsets

DATA = Path(__file__).parents[2] / "data" / "formats"
OOXML = "application/vnd.openxmlformats-officedocument"
ODF = "application/vnd.oasis.opendocument"

# file, the content type its bytes say (whatever its name or declared type)
FILES = [
    ("zstd-readme.docx", f"{OOXML}.wordprocessingml.document"),
    ("zstd-readme.odt", f"{ODF}.text"),
    ("zstd-readme.epub", "application/epub+zip"),
    ("zstd-readme.rtf", "application/rtf"),
    ("zstd-readme.pptx", f"{OOXML}.presentationml.presentation"),
    ("zstd-readme.odp", f"{ODF}.presentation"),
    ("debian-releases.xlsx", f"{OOXML}.spreadsheetml.sheet"),
    ("debian-releases.ods", f"{ODF}.spreadsheet"),
]
README_HEADER = "Compressor name | Ratio | Compression | Decompress."
RELEASES_HEADER = "version | codename | series | created | release | eol | eol-lts | eol-elts"
MSG = "application/vnd.ms-outlook"


def _parsed(name: str, content_type: str | None = None):  # type: ignore[no-untyped-def]
    raw = (DATA / name).read_bytes()
    return parse(raw, content_type or resolve_content_type(None, name, raw))


@pytest.mark.parametrize(("name", "content_type"), FILES)
def test_a_container_format_is_told_by_its_bytes_not_its_name(name: str, content_type: str) -> None:
    raw = (DATA / name).read_bytes()
    assert resolve_content_type("application/octet-stream", "upload.bin", raw) == content_type
    assert resolve_content_type("text/plain", "notes.txt", raw) == content_type
    screen_upload(raw, content_type, name)  # a real file passes the archive's checks


@pytest.mark.parametrize(
    "name", ["zstd-readme.docx", "zstd-readme.odt", "zstd-readme.epub", "zstd-readme.pptx",
             "zstd-readme.odp"],
)  # fmt: skip
def test_a_documents_table_is_read_a_row_at_a_time_under_its_header(name: str) -> None:
    doc = _parsed(name)
    row = doc.text.index("zstd 1.5.1 -1 | 2.887 | 530 MB/s | 1700 MB/s")
    assert doc.section_at(row).endswith(README_HEADER)
    assert TABLE in doc.flags_at(row)
    assert "Benchmarks" in doc.section_at(row)


@pytest.mark.parametrize(
    "name",
    ["zstd-readme.docx", "zstd-readme.odt", "zstd-readme.epub", "zstd-readme.rtf",
     "zstd-readme.pptx"],  # pandoc's deck: its subheadings are short bold paragraphs
)  # fmt: skip
def test_headings_become_section_paths_and_the_text_reads_whole(name: str) -> None:
    doc = _parsed(name)
    at = doc.text.index("By default, CMAKE_BUILD_TYPE is set to Release.")
    if name.endswith(".rtf"):  # striprtf resolves no heading styles: the text alone
        assert doc.sections == []
    else:
        assert doc.section_at(at).endswith("cmake")
        assert "Build instructions" in doc.section_at(at)
        # its first line, as the HTML and Markdown parsers write a heading: a chunk that
        # begins within it says what it is about even where a stub of the section before
        # was joined to it (and the chunk's section path is that section's)
        start = max(s.start for s in doc.sections if s.start <= at)
        assert doc.text[start:].startswith("cmake\n\n")


@pytest.mark.parametrize("name", ["zstd-readme.pptx", "zstd-readme.odp"])
def test_a_deck_has_a_section_per_slide_headed_by_its_title(name: str) -> None:
    doc = _parsed(name)
    paths = [s.path for s in doc.sections]
    assert "Slide 1: Zstandard" in paths
    slide_titles = [p for p in paths if p.startswith("Slide ") and " > " not in p]
    numbers = [int(p.split()[1].rstrip(":")) for p in slide_titles]
    assert numbers == sorted(numbers) and len(set(numbers)) >= 8


def test_speaker_notes_are_kept_under_their_slide_and_marked() -> None:
    from pptx import Presentation

    deck = Presentation(str(DATA / "zstd-readme.pptx"))  # pandoc's deck, notes added here
    deck.slides[2].notes_slide.notes_text_frame.text = "Mention the Silesia corpus sizes."
    buffer = io.BytesIO()
    deck.save(buffer)
    doc = parse(buffer.getvalue(), f"{OOXML}.presentationml.presentation")
    at = doc.text.index("Mention the Silesia corpus sizes.")
    assert doc.section_at(at) == "Slide 3: Benchmarks > Speaker notes"


@pytest.mark.parametrize(
    "name", ["debian-releases.xlsx", "debian-releases.ods", "debian-releases.csv",
             "debian-releases.tsv"],
)  # fmt: skip
def test_a_sheets_rows_are_kept_whole_under_the_header_row(name: str) -> None:
    doc = _parsed(name)
    row = doc.text.index("12 | Bookworm | bookworm | 2021-08-14 | 2023-06-10 | 2026-07-11")
    assert doc.section_at(row).endswith(RELEASES_HEADER)
    assert TABLE in doc.flags_at(row)
    assert RELEASES_HEADER not in doc.text  # the header is the path, not a row
    # every chunk of the sheet says its columns, and no row is cut
    for chunk in Chunker(word_offsets, max_tokens=64, overlap_tokens=0).chunk(doc):
        assert chunk.section.endswith(RELEASES_HEADER), chunk.section
        assert all(line.count(" | ") >= 3 for line in chunk.text.splitlines()), chunk.text


def test_formulas_read_by_their_cached_values_and_hidden_or_empty_sheets_are_skipped() -> None:
    import openpyxl

    book = openpyxl.load_workbook(DATA / "debian-releases.xlsx")  # LibreOffice's workbook
    sheet = book.active
    sheet["J1"], sheet["J2"] = "years supported", "=YEAR(F2)-YEAR(E2)"
    hidden = book.create_sheet("internal")
    hidden["A1"], hidden["A2"] = "secret column", "never indexed"
    hidden.sheet_state = "hidden"
    book.create_sheet("empty")
    buffer = io.BytesIO()
    book.save(buffer)
    # openpyxl writes no cached values: the formula cell reads as empty, never as its text
    doc = parse(buffer.getvalue(), f"{OOXML}.spreadsheetml.sheet")
    assert "=YEAR" not in doc.text and "never indexed" not in doc.text
    assert {s.path.split(" > ")[0] for s in doc.sections} == {"debian-releases"}
    # LibreOffice saved the same workbook with its formulas' values
    ods = _parsed("debian-releases.ods")
    assert "2 | Hamm | hamm | 1997-06-05" in ods.text


def test_a_workbook_formatted_down_a_million_rows_is_read_to_its_last_row_of_text() -> None:
    rows = "".join(f'<row r="{n}"><c r="A{n}" s="1"/></row>' for n in range(3, 1_000_001))
    sheet = (
        '<?xml version="1.0" encoding="UTF-8"?><worksheet '
        'xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main">'
        '<dimension ref="A1:B1000000"/><sheetData>'
        '<row r="1"><c r="A1" t="inlineStr"><is><t>codename</t></is></c></row>'
        '<row r="2"><c r="A2" t="inlineStr"><is><t>Bookworm</t></is></c></row>'
        f"{rows}</sheetData></worksheet>"
    )
    raw = _replace_member(DATA / "debian-releases.xlsx", "xl/worksheets/sheet1.xml", sheet)
    doc = parse(raw, f"{OOXML}.spreadsheetml.sheet")
    assert doc.text == "Bookworm"
    assert doc.section_at(0) == "debian-releases > codename"


ANNOUNCEMENT = "What Zstandard is, and the Debian release table"


def _assert_the_announcement(doc, sender: str) -> None:  # type: ignore[no-untyped-def]
    """The zstd announcement as an e-mail reads: its header block under its subject, its
    text, its CSV attachment under the table's header, its picture listed by name."""
    assert doc.sections[0].path == ANNOUNCEMENT
    assert doc.text.startswith(f"Subject: {ANNOUNCEMENT}\nFrom: {sender}")
    assert "Date: Mon, 30 Nov 2026 09:30:00 +0000" in doc.text
    assert "is a fast lossless compression algorithm" in doc.text
    row = doc.text.index("12 | Bookworm | bookworm")
    assert doc.section_at(row) == f"{ANNOUNCEMENT} > Attachment: debian.csv > {RELEASES_HEADER}"
    listed = doc.text.index("- logo.png")
    assert doc.section_at(listed) == f"{ANNOUNCEMENT} > Attachments not read"


def test_an_e_mail_reads_its_headers_text_and_supported_attachments() -> None:
    doc = _parsed("zstd-announcement.eml")
    _assert_the_announcement(doc, "Release team <releases@example.org>")


def test_an_outlook_message_reads_as_the_same_e_mail_does() -> None:
    """The .eml above converted to Outlook's .msg by aspose-email-foss (tests/data/formats/
    make.sh), read by extract-msg: its bytes say what it is, whatever the upload's name."""
    raw = (DATA / "zstd-announcement.msg").read_bytes()
    assert resolve_content_type("application/octet-stream", "upload.bin", raw) == MSG
    screen_upload(raw, MSG, "announcement.msg")
    doc = _parsed("zstd-announcement.msg")
    _assert_the_announcement(doc, "Release team")
    assert "To: Packaging list <packaging@example.org>" in doc.text


def test_an_ole_file_that_is_no_outlook_message_is_still_refused() -> None:
    """An old binary Office file is an OLE file too: refused with what to do, as before."""
    import olefile

    raw = (DATA / "encrypted.docx").read_bytes()  # an OLE file, but no message
    assert olefile.isOleFile(raw)
    with pytest.raises(UnsupportedMediaType, match="encrypted"):
        resolve_content_type(None, "x.msg", raw)
    with pytest.raises(UnsupportedMediaType, match="not an Outlook message"):
        screen_upload(b"Subject: plain text, not OLE", MSG, "fake.msg")
    with pytest.raises(ParseError, match="Outlook message"):
        parse(raw[:4096], MSG)


def test_a_deck_of_more_slides_than_the_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slides_module, "MAX_SLIDES", 5)
    with pytest.raises(ParseError, match="slides; the limit is 5"):
        _parsed("zstd-readme.pptx")


def test_a_sheet_of_more_rows_than_the_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spreadsheets, "MAX_ROWS", 10)
    with pytest.raises(ParseError, match="more than 10 rows"):
        _parsed("debian-releases.csv")


# ------------------------------------------------------------------ hostile archives


def _replace_member(path: Path, member: str, content: str | bytes) -> bytes:
    source = zipfile.ZipFile(path)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as out:
        for info in source.infolist():
            data = content if info.filename == member else source.read(info)
            out.writestr(info.filename, data)
    return buffer.getvalue()


def _with_member(path: Path, name: str, data: bytes, encrypted: bool = False) -> bytes:
    source = zipfile.ZipFile(path)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as out:
        for info in source.infolist():
            out.writestr(info.filename, source.read(info))
        out.writestr(name, data)
    raw = bytearray(buffer.getvalue())
    if encrypted:  # the member's "encrypted" bit, in its directory entry (zipfile writes none)
        entry = raw.rindex(b"PK\x01\x02")
        raw[entry + 8] |= 0x1
    return bytes(raw)


DOCX = f"{OOXML}.wordprocessingml.document"
HOSTILE = [
    # a zip bomb dressed as a Word file: 20 MB of zeros in a 40 KB archive
    ("bomb.docx", lambda: _with_member(DATA / "zstd-readme.docx", "word/media/x.bin",
                                       b"\0" * 20_000_000), ParseError, "zip bomb"),
    ("climb.docx", lambda: _with_member(DATA / "zstd-readme.docx", "../../etc/cron.d/x",
                                        b"x"), ParseError, "outside itself"),
    ("locked.docx", lambda: _with_member(DATA / "zstd-readme.docx", "word/secret.xml", b"<x/>",
                                         encrypted=True), UnsupportedMediaType, "encrypted"),
    ("laughs.docx", lambda: _replace_member(
        DATA / "zstd-readme.docx", "word/document.xml",
        '<?xml version="1.0"?><!DOCTYPE d [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;">]>'
        "<d>&b;</d>"), ParseError, "declares XML entities"),
    ("encrypted.docx", lambda: (DATA / "encrypted.docx").read_bytes(), UnsupportedMediaType,
     "password-protected"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "make", "error", "reason"), HOSTILE)
def test_a_hostile_archive_is_refused_at_the_door_with_its_reason(
    name: str, make, error: type[Exception], reason: str
) -> None:  # type: ignore[no-untyped-def]
    raw = make()
    with pytest.raises(error, match=reason):
        screen_upload(raw, resolve_content_type(DOCX, name, raw), name)


def test_an_archive_that_is_no_document_is_refused_as_before() -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
    raw = buffer.getvalue()
    content_type = resolve_content_type("application/java-archive", "app.txt", raw)
    with pytest.raises(UnsupportedMediaType, match="no Word, PowerPoint, Excel, OpenDocument"):
        screen_upload(raw, content_type, "app.txt")
    with pytest.raises(UnsupportedMediaType, match="the file is not a ZIP archive, as every docx"):
        screen_upload(b"plain words", DOCX, "fake.docx")


@pytest.mark.parametrize(
    "name", [name for name, _ in FILES] + ["zstd-announcement.eml", "zstd-announcement.msg"]
)
def test_every_section_starts_inside_the_text_and_the_document_chunks(name: str) -> None:
    """A section opened after the last block (EbookLib's book ended with a table) was past
    the text's end, and the chunker read past it."""
    doc = _parsed(name)
    assert all(0 <= s.start < len(doc.text) for s in doc.sections)
    chunks = Chunker(word_offsets, max_tokens=48, overlap_tokens=8).chunk(doc)
    assert chunks and all(0 <= c.char_start < c.char_end <= len(doc.text) for c in chunks)
    assert chunks[-1].char_end >= len(doc.text.rstrip()) - 1  # read to the end


# ------------------------------------------------------------------ OCR


def _holds_at_similarity(text: str, quote: str, at_least: float = 0.9) -> bool:
    """Whether some window of ``text`` matches ``quote`` at ``at_least`` similarity (OCR may
    misread a character or two)."""
    import difflib

    words, wanted = text.split(), quote.split()
    for start in range(max(1, len(words) - len(wanted) + 1)):
        window = " ".join(words[start : start + len(wanted)])
        if difflib.SequenceMatcher(None, window, quote).ratio() >= at_least:
            return True
    return False


def test_a_page_image_is_read_by_ocr_and_flagged() -> None:
    doc = _parsed("zstd-readme-page-1.jpg")
    assert resolve_content_type("text/plain", "scan.txt", (DATA / "zstd-readme-page-1.jpg")
                                .read_bytes()) == "image/jpeg"  # fmt: skip
    assert _holds_at_similarity(
        doc.text, "Zstandard, or zstd as short version, is a fast lossless compression algorithm"
    )
    assert {flag for s in doc.sections for flag in s.flags} == {"ocr", "doubtful_extraction"}


def test_a_scanned_pdf_is_read_by_ocr_within_its_page_bound() -> None:
    """Two scanned pages, OCR bounded to one: the first is read, the second named unread."""
    from shared.parsing import ParseOptions

    raw = (DATA / "zstd-readme-scanned.pdf").read_bytes()
    doc = parse(raw, "application/pdf", ParseOptions(ocr_max_pages=1))
    assert [(s.path, s.flags) for s in doc.sections] == [("page 1", ("doubtful_extraction", "ocr"))]
    assert _holds_at_similarity(doc.text, "targeting real-time compression scenarios at zlib-level")
    assert doc.notes == [
        "page 2 not read: OCR reads the first 1 of a document's pages (CONCORD_OCR_MAX_PAGES)"
    ]
    with pytest.raises(ParseError, match="OCR read no text on its pages \\(pages 1-2 not read"):
        parse(raw, "application/pdf", ParseOptions(ocr_budget_s=0))


def test_without_tesseract_a_scan_fails_as_the_servers_fault_with_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not a ParseError (the upload's fault, failed for good): the job is dead-lettered, and
    replayed once Tesseract is installed."""
    from shared.parsing import ocr

    monkeypatch.setattr(ocr, "TESSERACT", "/nonexistent/tesseract")
    with pytest.raises(ocr.OcrUnavailable, match="apt-get install tesseract-ocr") as refused:
        _parsed("zstd-readme-page-1.jpg")
    assert not isinstance(refused.value, ParseError)


def test_only_the_pages_ocr_reads_are_decoded() -> None:
    """A TIFF of three pages, OCR bounded to one: the other two are named, never decoded
    (400 pages decoded before the bound once took 1.8 GB)."""
    from PIL import Image

    from shared.parsing import ParseOptions

    page = Image.open(DATA / "zstd-readme-page-1.jpg")
    buffer = io.BytesIO()
    page.save(buffer, format="TIFF", save_all=True, append_images=[page, page])
    doc = parse(buffer.getvalue(), "image/tiff", ParseOptions(ocr_max_pages=1))
    assert [s.path for s in doc.sections] == ["page 1"]
    assert doc.notes[0].startswith("pages 2-3 not read")


def test_an_image_too_large_or_unreadable_is_refused_at_the_door(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from shared.parsing import ocr

    raw = (DATA / "zstd-readme-page-1.jpg").read_bytes()
    monkeypatch.setattr(ocr, "MAX_PIXELS", 1000)
    with pytest.raises(ParseError, match="pixels; the limit is 1,000 pixels a page"):
        screen_upload(raw, "image/jpeg", "scan.jpg")
    with pytest.raises(ParseError, match="the image could not be read"):
        screen_upload(raw[:200], "image/jpeg", "cut.jpg")


@pytest.mark.parametrize(
    ("name", "macro_type"),
    [
        ("zstd-readme.docx", "application/vnd.ms-word.document.macroEnabled.main+xml"),
        ("zstd-readme.pptx", "application/vnd.ms-powerpoint.presentation.macroEnabled.main+xml"),
        ("debian-releases.xlsx", "application/vnd.ms-excel.sheet.macroEnabled.main+xml"),
    ],
)
def test_an_office_file_with_macros_is_indexed_as_text_and_its_macros_never_opened(
    name: str, macro_type: str
) -> None:
    """A .docm/.pptm/.xlsm: the same file with a macro project and the macro-enabled main
    type (as Office saves one). Its text is read; its macro project is dropped unread."""
    source = zipfile.ZipFile(DATA / name)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as out:
        for info in source.infolist():
            data = source.read(info)
            if info.filename == "[Content_Types].xml":
                plain = data.decode()
                main = next(
                    t
                    for t in (
                        f"{OOXML}.wordprocessingml.document.main+xml",
                        f"{OOXML}.presentationml.presentation.main+xml",
                        f"{OOXML}.spreadsheetml.sheet.main+xml",
                    )
                    if t in plain
                )
                data = plain.replace(main, macro_type).encode()
            out.writestr(info.filename, data)
        out.writestr("word/vbaProject.bin", b"\xd0\xcf\x11\xe0 not a project anyone may run")
    raw = buffer.getvalue()
    macro_name = name.rsplit(".", 1)[0] + ".docm"
    content_type = resolve_content_type(None, macro_name, raw)
    screen_upload(raw, content_type, macro_name)
    assert parse(raw, content_type).text == _parsed(name).text


def test_a_table_row_is_embedded_under_its_header_row_and_prose_as_it_is() -> None:
    """A row of bare values says nothing of its columns; the question names them. (The
    formats set's sheet questions were abstained below the dense threshold with their row
    first: 5 of 16.)"""
    from shared.ingest.chunking import contextual_text

    doc = _parsed("debian-releases.xlsx")
    [chunk, *_] = Chunker(word_offsets, max_tokens=48, overlap_tokens=0).chunk(doc)
    seen = contextual_text(chunk.text, "debian-releases", chunk.section, "none", chunk.flags)
    assert seen == f"debian-releases > {RELEASES_HEADER}\n\n{chunk.text}"
    prose = "Zstandard is a fast lossless compression algorithm."
    assert contextual_text(prose, "zstd", "Zstandard > Benchmarks", "none", ()) == prose
    titled = contextual_text(chunk.text, "Releases", chunk.section, "title", chunk.flags)
    assert titled == f"Releases\ndebian-releases > {RELEASES_HEADER}\n\n{chunk.text}"


# ------------------------------------------------------------------ what an audit found


def _corrupted(path: Path) -> bytes:
    raw = bytearray(path.read_bytes())
    entry = raw.index(b"PK\x01\x02")  # the first member's CRC, in the central directory
    raw[entry + 16] ^= 0xFF
    return bytes(raw)


def test_a_broken_archive_is_a_parse_error_at_the_door_not_a_crash() -> None:
    """A bad CRC raised zipfile's BadZipFile out of screening: the API answered 500."""
    raw = _corrupted(DATA / "zstd-readme.docx")
    with pytest.raises(ParseError, match="cannot be read"):
        screen_upload(raw, resolve_content_type(DOCX, "bad.docx", raw), "bad.docx")


def test_an_archive_declared_as_an_office_file_must_hold_one() -> None:
    """A plain ZIP declared .docx passed intake and failed in the worker with a KeyError."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr("notes.txt", "not a Word file")
    with pytest.raises(UnsupportedMediaType, match="no Word, PowerPoint, Excel"):
        screen_upload(buffer.getvalue(), DOCX, "notes.docx")
    odt = (DATA / "zstd-readme.odt").read_bytes()
    with pytest.raises(UnsupportedMediaType, match="the archive is a odt file"):
        screen_upload(odt, DOCX, "renamed.docx")


def test_what_a_library_cannot_read_is_a_parse_error_naming_the_format() -> None:
    """openpyxl raises ValueError for a number cell that holds no number: a dead letter
    (someone's to replay) instead of a failed upload with its reason."""
    sheet = (
        '<?xml version="1.0" encoding="UTF-8"?><worksheet '
        'xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main"><sheetData>'
        '<row r="1"><c r="A1" t="n"><v>abc</v></c></row></sheetData></worksheet>'
    )
    raw = _replace_member(DATA / "debian-releases.xlsx", "xl/worksheets/sheet1.xml", sheet)
    with pytest.raises(ParseError, match="the xlsx file could not be read \\(ValueError"):
        parse(raw, f"{OOXML}.spreadsheetml.sheet")


def test_rows_are_kept_as_long_as_they_are() -> None:
    """One row of 4,000 columns over 8,000 rows of one cell: padded to the widest row, a
    20 KB CSV became 96 million characters."""
    raw = ",".join(f"c{i}" for i in range(4000)).encode() + b"\n" + b"x\n" * 8000
    doc = parse(raw, "text/csv")
    assert len(doc.text) < 3 * len(raw)


def test_a_chapter_the_spine_names_twice_is_read_once() -> None:
    source = zipfile.ZipFile(DATA / "zstd-readme.epub")
    [opf] = [name for name in source.namelist() if name.endswith(".opf")]
    package = source.read(opf).decode()
    itemref = package[package.index("<itemref") : package.index(">", package.index("<itemref")) + 1]
    raw = _replace_member(DATA / "zstd-readme.epub", opf, package.replace(itemref, itemref * 50))
    doc = parse(raw, "application/epub+zip")
    assert doc.text == _parsed("zstd-readme.epub").text


def test_a_sheets_repeated_cells_are_bounded() -> None:
    """A cell repeated a million times across a row made a 31 KB .ods 41 million characters."""
    source = zipfile.ZipFile(DATA / "debian-releases.ods")
    content = source.read("content.xml").decode()
    repeated = content.replace(
        "<table:table-cell ", '<table:table-cell table:number-columns-repeated="1000000" ', 1
    )
    doc = parse(
        _replace_member(DATA / "debian-releases.ods", "content.xml", repeated),
        f"{ODF}.spreadsheet",
    )
    assert len(doc.text) < 50_000


def test_text_that_starts_like_rtf_is_read_as_what_it_was_declared() -> None:
    raw = b"{\\rtf1 is how an RTF file starts.\n\n# Notes\n\nA Markdown note about RTF."
    assert resolve_content_type("text/markdown", "notes.md", raw) == "text/markdown"
    assert resolve_content_type(None, "notes", raw) == "application/rtf"


def _pdf_with_a_scan_page_stating(width: int, height: int, text_page: str) -> bytes:
    """A PDF whose first page draws one image stating ``width`` x ``height`` pixels (its
    stream a single byte: what it states is all a reader may trust before decoding) and has
    no text layer, and whose second page is ``text_page`` as a text layer."""
    escaped = text_page.replace("(", "\\(").replace(")", "\\)")
    text = f"BT /F1 10 Tf 40 800 Td ({escaped}) Tj ET".encode()
    draw = b"q 612 0 0 842 0 0 cm /Im0 Do Q"
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R 6 0 R] /Count 2 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 842] /Contents 4 0 R "
        b"/Resources << /XObject << /Im0 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n" % len(draw) + draw + b"\nendstream",
        b"<< /Type /XObject /Subtype /Image /Width %d /Height %d /ColorSpace /DeviceGray "
        b"/BitsPerComponent 8 /Length 1 >>\nstream\n\x00\nendstream" % (width, height),
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 842] /Contents 7 0 R "
        b"/Resources << /Font << /F1 8 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n" % len(text) + text + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    return pdf_of(objects)


def test_a_pdf_page_image_stating_too_many_pixels_is_never_decoded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """pypdf decodes every image of a page at once: a stream stating 100,000 pixels square
    would be 10 GB before any size could be read from its pixels. The stated size is checked
    first; the page is named as unread, the rest of the document indexed."""
    from pypdf import PageObject

    def never_decoded(self: PageObject) -> None:
        raise AssertionError("the page's images were decoded")

    monkeypatch.setattr(PageObject, "images", property(never_decoded))
    raw = _pdf_with_a_scan_page_stating(100_000, 100_000, "The second page has its own text.")
    doc = parse(raw, "application/pdf")
    assert "The second page has its own text." in doc.text
    assert doc.notes == [
        "page 1 not read: the image is 100000x100000 pixels; the limit is 60,000,000 pixels a page"
    ]


def test_an_e_mails_archives_share_one_inflation_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each attachment passes the archive checks on its own; together they may not inflate
    more than one archive may, nor more than MAX_ATTACHMENTS be read (nested messages
    included): the rest are listed with the reason."""
    from email.message import EmailMessage

    from shared.parsing import mail

    docx = (DATA / "zstd-readme.docx").read_bytes()
    inflated = sum(i.file_size for i in zipfile.ZipFile(io.BytesIO(docx)).infolist())
    monkeypatch.setattr(mail, "MAX_INFLATED_BYTES", 2 * inflated + 1)
    message = EmailMessage()
    message["Subject"] = "Three copies of the readme"
    message.set_content("See the attachments.")
    for n in (1, 2, 3):
        message.add_attachment(
            docx, maintype="application", subtype="octet-stream", filename=f"readme-{n}.docx"
        )
    doc = parse(message.as_bytes(), "message/rfc822")
    read = [s.path for s in doc.sections if s.path.endswith("Attachment: readme-1.docx")]
    assert read and "Attachment: readme-2.docx" in " ".join(s.path for s in doc.sections)
    assert "Attachment: readme-3.docx" not in " ".join(s.path for s in doc.sections)
    assert "- readme-3.docx (its archive would pass the" in doc.text


def test_an_e_mail_reads_at_most_max_attachments_parts_nested_messages_included(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from email.message import EmailMessage

    from shared.parsing import mail

    monkeypatch.setattr(mail, "MAX_ATTACHMENTS", 2)
    inner = EmailMessage()
    inner["Subject"] = "Inner"
    inner.set_content("inner body")
    inner.add_attachment(b"inner note text", maintype="text", subtype="plain", filename="a.txt")
    outer = EmailMessage()
    outer["Subject"] = "Outer"
    outer.set_content("outer body")
    outer.add_attachment(inner)  # one part, and its own attachment another
    outer.add_attachment(b"third part text", maintype="text", subtype="plain", filename="b.txt")
    doc = parse(outer.as_bytes(), "message/rfc822")
    assert "inner note text" in doc.text
    assert "third part text" not in doc.text
    assert "- b.txt (past the 2 attachments a message's are read to)" in doc.text


def test_a_web_pages_heading_permalinks_stay_out_of_the_section_path() -> None:
    """pandoc keeps a web page's permalink ("Error events#", a link to the heading's own
    anchor) in the Word file it writes; the section path is the heading's words."""
    devset = Path(__file__).parents[3] / "evaluation" / "devsets" / "formats" / "files"
    raw = (devset / "node-events.docx").read_bytes()
    doc = parse(raw, resolve_content_type(None, "node-events.docx", raw))
    paths = {s.path for s in doc.sections}
    assert "node-events > Node.js v20.20.2 documentation > Events > Error events" in paths
    assert not [p for p in paths if p.endswith("#")]


def _one_page(resources: bytes, *more: bytes) -> bytes:
    draw = b"q 612 0 0 842 0 0 cm /Fm0 Do Q"
    return pdf_of(
        [
            b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 842] /Contents 4 0 R "
            b"/Resources " + resources + b" >>",
            b"<< /Length %d >>\nstream\n" % len(draw) + draw + b"\nendstream",
            *more,
        ]
    )


def test_a_form_that_draws_itself_many_times_is_walked_once() -> None:
    """24 references of a form to itself were 24^5 visits (6 s; 100 of them, hours)."""
    from pypdf import PdfReader

    from shared.parsing import pdf

    selves = b" ".join(b"/S%d 5 0 R" % n for n in range(24))
    raw = _one_page(
        b"<< /XObject << /Fm0 5 0 R >> >>",
        b"<< /Type /XObject /Subtype /Form /BBox [0 0 1 1] /Resources << /XObject << "
        + selves
        + b" >> >> /Length 0 >>\nstream\n\nendstream",
    )
    page = PdfReader(io.BytesIO(raw)).pages[0]
    assert pdf._page_images(page) == []


def test_an_image_whose_size_is_an_indirect_number_is_read_and_its_real_size_checked() -> None:
    from pypdf import PdfReader

    from shared.parsing import pdf

    pixels = b"\xff" * 6
    raw = _one_page(
        b"<< /XObject << /Fm0 5 0 R >> >>",
        b"<< /Type /XObject /Subtype /Image /Width 6 0 R /Height 1 /ColorSpace /DeviceGray "
        b"/BitsPerComponent 8 /Length 6 >>\nstream\n" + pixels + b"\nendstream",
        b"6",
    )
    page = PdfReader(io.BytesIO(raw)).pages[0]
    [(width, height, _)] = pdf._page_images(page)
    assert (width, height) == (6, 1)
    assert pdf._largest_image_loader(page)().size == (6, 1)


def test_a_narrow_page_is_scaled_up_for_ocr_but_never_past_the_pixel_limit() -> None:
    from shared.parsing.ocr import MAX_PIXELS, MIN_OCR_WIDTH, ocr_size

    assert ocr_size(800, 1000) == (MIN_OCR_WIDTH, 2000)
    assert ocr_size(2400, 3000) == (2400, 3000)
    width, height = ocr_size(100, 600_000)  # within the limit; 16 times wider, 15 GB
    assert width * height <= MAX_PIXELS and width == 100


def test_an_archive_behind_other_bytes_is_charged_to_the_e_mails_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A .docx with two bytes before it is still read as one (the registry knows it by its
    central directory, found from the end), so the budget must charge it too; an attachment
    of no supported type uses none of the budget."""
    from email.message import EmailMessage

    from shared.parsing import mail

    docx = (DATA / "zstd-readme.docx").read_bytes()
    inflated = sum(i.file_size for i in zipfile.ZipFile(io.BytesIO(docx)).infolist())
    monkeypatch.setattr(mail, "MAX_INFLATED_BYTES", inflated + 1)
    monkeypatch.setattr(mail, "MAX_ATTACHMENTS", 2)
    message = EmailMessage()
    message["Subject"] = "Padded"
    message.set_content("body")
    message.add_attachment(b"\x89PNG not really", maintype="image", subtype="x-unknown",
                           filename="junk.bin")  # fmt: skip
    for n in (1, 2):
        message.add_attachment(
            b"\r\n" + docx, maintype="application", subtype="octet-stream", filename=f"r{n}.docx"
        )
    doc = parse(message.as_bytes(), "message/rfc822")
    paths = " ".join(s.path for s in doc.sections)
    assert "Attachment: r1.docx" in paths and "Attachment: r2.docx" not in paths
    assert "- r2.docx (its archive would pass the" in doc.text
    assert "- junk.bin" in doc.text


def test_a_sign_that_is_part_of_a_heading_stays() -> None:
    """Only a sign last in the heading, linking to the heading itself (or to no bookmark),
    is a permalink: "Learning C#" whose "#" links to another section keeps it."""
    import docx as python_docx

    document = python_docx.Document()
    target = document.add_heading("Operators", level=1)
    start = target._p.makeelement(
        "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}bookmarkStart",
        {
            "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}id": "1",
            "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}name": "operators",
        },
    )
    target._p.append(start)
    document.add_paragraph("The operators of the language.")
    heading = document.add_heading("Learning C", level=1)
    w = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
    link = heading._p.makeelement(f"{w}hyperlink", {f"{w}anchor": "operators"})
    run = link.makeelement(f"{w}r", {})
    text = run.makeelement(f"{w}t", {})
    text.text = "#"
    run.append(text)
    link.append(run)
    heading._p.append(link)
    document.add_paragraph("C# has operators.")
    buffer = io.BytesIO()
    document.save(buffer)
    doc = parse(buffer.getvalue(), f"{OOXML}.wordprocessingml.document")
    assert "Learning C#" in {s.path for s in doc.sections}
