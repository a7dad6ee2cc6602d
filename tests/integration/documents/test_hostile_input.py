"""Hostile uploads: every file of a malicious corpus gets a 4xx at intake (never a 5xx), nothing
is stored for it, and the worker keeps indexing normal documents afterwards; oversized bodies
are refused while streaming, with or without Content-Length."""

from __future__ import annotations

import gzip
import io
import zipfile
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.helpers import document_count, key_headers, upload_text, wait_job


def _zip_bomb() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("bomb.txt", b"0" * 5_000_000)  # 5 MB of zeros deflates to ~5 KB
    return buffer.getvalue()


def _minimal_pdf_then(tail: bytes) -> bytes:
    return b"%PDF-1.4\n" + tail


BILLION_LAUGHS = (
    b'<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
    b'<!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">'
    b'<!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">]>'
    b"<lolz>&lol3;</lolz>"
)
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + b"\x00" * 40
JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + b"\x00" * 40
GIF = b"GIF89a" + b"\x01\x00\x01\x00\x00\x00\x00" + b";"
ELF = b"\x7fELF\x02\x01\x01" + b"\x00" * 60
EXE = b"MZ\x90\x00\x03\x00\x00\x00" + b"\x00" * 56
OLE = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\x00" * 60
TEXT = b"Perfectly ordinary text about lighthouses."

# name, bytes, declared content type, the status expected
MALICIOUS: list[tuple[str, bytes, str, int]] = [
    # spoofed types: binary formats claiming to be text (images are read by OCR, whatever
    # they claim: these two are no readable images)
    ("image.txt", PNG, "text/plain", 422),
    ("photo.md", JPEG, "text/markdown", 422),
    ("anim.html", GIF, "text/html", 415),
    ("program.txt", ELF, "text/plain", 415),
    ("setup.txt", EXE, "text/plain", 415),
    ("legacy.doc.txt", OLE, "text/plain", 415),
    ("data.json", gzip.compress(b'{"text": "x"}'), "application/json", 415),
    ("report.pdf", TEXT, "application/pdf", 415),  # claims PDF, is not
    ("nul.txt", b"text with a \x00 NUL byte inside", "text/plain", 415),
    ("binary.bin", bytes(range(256)) * 4, "application/octet-stream", 415),
    ("archive.txt", b"BZh91AY&SY" + b"\x00" * 30, "text/plain", 415),
    ("packed.txt", b"\xfd7zXZ\x00" + b"\x00" * 30, "text/plain", 415),
    ("seven.txt", b"7z\xbc\xaf\x27\x1c" + b"\x00" * 30, "text/plain", 415),
    ("rar.txt", b"Rar!\x1a\x07\x00" + b"\x00" * 30, "text/plain", 415),
    ("class.txt", b"\xca\xfe\xba\xbe" + b"\x00" * 30, "text/plain", 415),
    # polyglots
    ("gifar.txt", GIF + b"PK\x03\x04" + b"\x00" * 30, "text/plain", 415),
    ("zip-then-pdf.pdf", b"PK\x03\x04" + b"%PDF-1.4", "application/pdf", 415),
    ("pdf-then-zip.pdf", _minimal_pdf_then(b"PK\x03\x04" + b"\x00" * 40), "application/pdf", 422),
    ("png-with-script.html", PNG + b"<script>alert(1)</script>", "text/html", 422),
    # bombs
    ("bomb.zip", _zip_bomb(), "application/zip", 415),
    ("bomb.txt", _zip_bomb(), "text/plain", 415),
    ("lol.xml", BILLION_LAUGHS, "application/xml", 415),
    ("lol.html", BILLION_LAUGHS, "text/html", 422),
    ("lol.md", BILLION_LAUGHS, "text/markdown", 422),
    ("lol.txt", BILLION_LAUGHS, "text/plain", 422),
    # malformed PDFs
    ("truncated.pdf", b"%PDF-1.7\n1 0 obj\n<< /Type /Catalog", "application/pdf", 422),
    ("garbage.pdf", _minimal_pdf_then(b"\xff" * 200), "application/pdf", 422),
    (
        "bad-xref.pdf",
        _minimal_pdf_then(b"xref\n0 9999999\ntrailer<</Root 1 0 R>>\n%%EOF"),
        "application/pdf",
        422,
    ),
    ("header-only.pdf", b"%PDF-", "application/pdf", 422),
    # 0-byte and whitespace-only
    ("empty.txt", b"", "text/plain", 400),
    # path-traversal and hostile names
    ("../../etc/passwd", TEXT, "text/plain", 400),
    ("..\\..\\windows\\win.ini", TEXT, "text/plain", 400),
    ("/abs/path.txt", TEXT, "text/plain", 400),
    ("./uploads/../../x.txt", TEXT, "text/plain", 400),
    ("..", TEXT, "text/plain", 400),
    # unsupported declared types
    ("page.svg", b"<svg xmlns='http://www.w3.org/2000/svg'/>", "image/svg+xml", 415),
]


def test_the_corpus_is_big_enough() -> None:
    assert len(MALICIOUS) >= 30


@pytest.fixture
def corpus_results(
    client: TestClient, auth: dict[str, str], tenant: str, worker
) -> Iterator[list[tuple[str, int, Any]]]:
    results = []
    for name, raw, content_type, expected in MALICIOUS:
        response = client.post(
            "/v1/documents", headers=auth, files={"file": (name, raw, content_type)}
        )
        results.append((name, expected, response))
    yield results


def test_every_malicious_file_gets_its_4xx_and_nothing_is_stored(
    corpus_results, client: TestClient, auth: dict[str, str], tenant: str
) -> None:
    for name, expected, response in corpus_results:
        assert response.status_code == expected, (name, response.status_code, response.text)
        assert response.json()["error"]["message"], name
    assert document_count(tenant) == 0
    # The worker is unaffected: an ordinary document right after the corpus is indexed.
    ok = upload_text(client, auth, "after.txt", "Lighthouses guide ships past rocky coasts.")
    assert wait_job(client, auth, ok["job_id"])["state"] == "indexed"


def test_oversized_uploads_are_refused_while_streaming(
    client: TestClient, auth: dict[str, str], tenant: str
) -> None:
    from shared.settings import get_settings

    limit = get_settings().max_upload_bytes

    def endless_chunks() -> Iterator[bytes]:  # no Content-Length: a chunked upload
        for _ in range(200):
            yield b"x" * (64 * 1024)

    chunked = client.post(
        "/v1/documents",
        headers={**auth, "Content-Type": "application/json"},
        content=endless_chunks(),
    )
    assert chunked.status_code == 413, chunked.text
    declared = client.post(
        "/v1/documents",
        headers={**auth, "Content-Type": "application/json", "Content-Length": str(limit * 10)},
        content=b"{}",
    )
    assert declared.status_code == 413
    big_file = client.post(
        "/v1/documents", headers=auth, files={"file": ("big.txt", b"y" * (limit + 1), "text/plain")}
    )
    assert big_file.status_code == 413
    assert document_count(tenant) == 0


# Form fields and JSON fields that break a published limit, that Postgres cannot store, or
# that would rewrite what a person reads (before: "evil\u202etxt.exe" was accepted, and the
# console showed it reversed): each refused with 422 and its reason, whichever way the upload
# comes in.
BAD_FIELDS = [
    ({"external_id": "evil\u202etxt.exe"}, "U+202E RIGHT-TO-LEFT OVERRIDE at position 4"),
    ({"external_id": "report\u200b.pdf"}, "U+200B ZERO WIDTH SPACE"),
    ({"title": "two\u2028lines"}, "U+2028 LINE SEPARATOR"),
    ({"title": "para\u2029graph"}, "U+2029 PARAGRAPH SEPARATOR"),
    ({"title": "bell\x07"}, "U+0007"),
    ({"external_id": "bom\ufeff"}, "U+FEFF ZERO WIDTH NO-BREAK SPACE"),
    ({"title": "t" * 1001}, "title is 1001 characters"),
    ({"external_id": "e" * 513}, "external_id is 513 characters"),
    ({"title": "a\x00b"}, "title must not contain NUL"),
    ({"metadata": {"score": float("nan")}}, "NaN"),
    ({"metadata": {"score": float("inf")}}, "infinite"),
    ({"metadata": {"note": "a\x00b"}}, "metadata must not contain NUL"),
]


@pytest.mark.parametrize(("fields", "reason"), BAD_FIELDS)
def test_bad_fields_are_refused_in_forms_and_in_json(
    client: TestClient, auth: dict[str, str], tenant: str, fields: dict[str, Any], reason: str
) -> None:
    import json

    fields = {"external_id": "x", **fields}
    form = {k: json.dumps(v) if k == "metadata" else v for k, v in fields.items()}
    multipart = client.post(
        "/v1/documents", headers=auth, data=form, files={"file": ("x.txt", TEXT, "text/plain")}
    )
    assert multipart.status_code == 422, multipart.text
    assert reason in multipart.json()["error"]["message"]
    body = json.dumps({"text": "Some text.", **fields})  # NaN as JSON's NaN
    as_json = client.post(
        "/v1/documents", headers={**auth, "Content-Type": "application/json"}, content=body
    )
    assert as_json.status_code == 422, as_json.text
    assert document_count(tenant) == 0


def test_an_unknown_form_field_is_refused_and_another_tenants_upload_goes_in(
    client: TestClient, auth: dict[str, str], tenant: str, worker: Any
) -> None:
    """Before, a misspelt ``extrnal_id`` was ignored, and the file's name became the
    document's id: a different document than the one the client meant."""
    misspelt = client.post(
        "/v1/documents",
        headers=auth,
        data={"extrnal_id": "handbook"},
        files={"file": ("handbook-v2.txt", TEXT, "text/plain")},
    )
    assert misspelt.status_code == 422, misspelt.text
    message = misspelt.json()["error"]["message"]
    assert "'extrnal_id'" in message and "external_id, file, metadata, title" in message
    other = upload_text(
        client, key_headers(f"{tenant}-other", ["read", "write"]), "n", TEXT.decode()
    )
    assert wait_job(client, key_headers(f"{tenant}-other", ["read", "write"]), other["job_id"])
    assert document_count(tenant) == 0
