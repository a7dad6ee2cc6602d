"""Office files, OpenDocument, e-books, e-mail (.eml and Outlook's .msg) and spreadsheets through
the API and a real worker: uploaded as a client sends them (a file name and
application/octet-stream), told by their bytes, indexed with their structure, and found by
search; hostile archives (and an Outlook message cut short) are refused at the door while
another tenant's ordinary uploads in the same batch go in untouched."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import select

from shared.db import unit_of_work
from shared.models import Chunk, Document, DocumentVersion
from tests.helpers import key_headers, paused, search
from tests.integration.jobs.test_job_isolation import (
    _assert_victim_unharmed,
    _victim_uploads,
    _wait_finished,
)
from tests.unit.ingest.test_formats import (
    DATA,
    FILES,
    HOSTILE,
    OOXML,
    _holds_at_similarity,
    _pdf_with_a_scan_page_stating,
    _replace_member,
)

# Every format, and a phrase of its answer that search must find in its chunks.
UPLOADS = [name for name, _ in FILES] + [
    "zstd-announcement.eml",
    "zstd-announcement.msg",  # Outlook's: told by its OLE streams
    "debian-releases.csv",
    "debian-releases.tsv",
    "zstd-readme-scanned-page-1.pdf",  # no text layer: read by OCR in the worker
]


def test_every_format_is_indexed_and_hostile_archives_are_refused_beside_another_tenant(
    client: TestClient, worker: Any
) -> None:
    owner, victim = f"f-{uuid.uuid4().hex[:10]}", f"v-{uuid.uuid4().hex[:10]}"
    auth = key_headers(owner, ["read", "write"])
    # A workbook of two rows of text formatted down 40,000 rows (what fits the suite's upload
    # limit; the unit test has a million): parsed in the worker, in the victim's batch.
    rows = "".join(f'<row r="{n}"><c r="A{n}" s="1"/></row>' for n in range(3, 40_001))
    tall = _replace_member(
        DATA / "debian-releases.xlsx",
        "xl/worksheets/sheet1.xml",
        '<?xml version="1.0" encoding="UTF-8"?><worksheet '
        'xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main"><sheetData>'
        '<row r="1"><c r="A1" t="inlineStr"><is><t>lighthouse</t></is></c></row>'
        '<row r="2"><c r="A2" t="inlineStr"><is><t>Fastnet Rock</t></is></c></row>'
        f"{rows}</sheetData></worksheet>",
    )
    accepted: dict[str, str] = {}
    with paused(worker):
        for name in UPLOADS:
            raw = (DATA / name).read_bytes()
            response = client.post(
                "/v1/documents",
                headers=auth,
                files={"file": (name, raw, "application/octet-stream")},
            )
            assert response.status_code == 202, (name, response.text)
            accepted[name] = response.json()["job_id"]
        response = client.post(
            "/v1/documents", headers=auth, files={"file": ("tall.xlsx", tall, "application/zip")}
        )
        assert response.status_code == 202, response.text
        accepted["tall.xlsx"] = response.json()["job_id"]
        # A page image stating 100,000 pixels square (10 GB decoded): never decoded, its
        # page named as unread, the rest of the PDF indexed.
        giant = _pdf_with_a_scan_page_stating(100_000, 100_000, "Lighthouse keepers log tides.")
        response = client.post(
            "/v1/documents", headers=auth, files={"file": ("giant.pdf", giant, "application/pdf")}
        )
        assert response.status_code == 202, response.text
        accepted["giant.pdf"] = response.json()["job_id"]
        for name, make, error, reason in HOSTILE:
            refused = client.post(
                "/v1/documents",
                headers=auth,
                files={"file": (name, make(), f"{OOXML}.wordprocessingml.document")},
            )
            expected = 415 if error.__name__ == "UnsupportedMediaType" else 422
            assert refused.status_code == expected, (name, refused.text)
            assert reason in refused.json()["error"]["message"], (name, refused.text)
        # An Outlook message cut short: no OLE file left to read, refused at the door.
        cut = (DATA / "zstd-announcement.msg").read_bytes()[:3000]
        cut_file = ("cut.msg", cut, "application/octet-stream")
        refused = client.post("/v1/documents", headers=auth, files={"file": cut_file})
        assert refused.status_code == 415, refused.text
        assert "not an Outlook message" in refused.json()["error"]["message"], refused.text
        victim_jobs = _victim_uploads(client, key_headers(victim, ["read", "write"]), n=4)
    _assert_victim_unharmed(victim, victim_jobs)
    jobs = _wait_finished(list(accepted.values()), timeout=180)
    assert {name: jobs[job].state for name, job in accepted.items()} == dict.fromkeys(
        accepted, "indexed"
    ), {name: jobs[job].error_message for name, job in accepted.items()}

    with unit_of_work() as uow:
        stored = dict(
            uow.session.execute(
                select(Document.external_id, DocumentVersion.content_type)
                .join(DocumentVersion, DocumentVersion.document_id == Document.id)
                .where(Document.tenant_id == owner)
            ).all()
        )
        texts: dict[str, list[tuple[str, str]]] = {}
        flags: dict[str, set[str]] = {}
        for external_id, text, section, chunk_flags in uow.session.execute(
            select(Document.external_id, Chunk.text, Chunk.section, Chunk.flags)
            .join(Chunk, Chunk.document_id == Document.id)
            .where(Document.tenant_id == owner)
        ):
            texts.setdefault(external_id, []).append((text, section))
            flags.setdefault(external_id, set()).update(chunk_flags)
    assert {name: stored[name] for name, _ in FILES} == dict(FILES)  # told by the bytes
    for name in UPLOADS:
        joined = " ".join(text for text, _ in texts[name])
        if name.startswith("zstd-readme-scanned"):
            assert _holds_at_similarity(joined, "is a fast lossless compression algorithm")
            assert flags[name] == {"ocr", "doubtful_extraction"}
        elif name.startswith("zstd-readme"):
            assert "CMAKE_BUILD_TYPE is set to Release" in joined, name
        else:
            assert "Bookworm | bookworm | 2021-08-14" in joined, name
    assert texts["tall.xlsx"] == [("Fastnet Rock", "debian-releases > lighthouse")]
    assert "Lighthouse keepers log tides." in " ".join(text for text, _ in texts["giant.pdf"])
    assert jobs[accepted["giant.pdf"]].detail["parse_notes"] == [
        "page 1 not read: the image is 100000x100000 pixels; the limit is 60,000,000 pixels a page"
    ]
    assert not any(
        stored_name.endswith(".docx") and stored_name != "zstd-readme.docx"
        for stored_name in stored
    )  # fmt: skip  (no hostile archive was stored)

    found = search(client, auth, "which Debian release is codenamed bookworm", top_k=5)
    rows = [r for r in found["results"] if "Bookworm | bookworm" in r["text"]]
    assert rows and rows[0]["section"].endswith("version | codename | series | created | release"
                                                " | eol | eol-lts | eol-elts")  # fmt: skip
