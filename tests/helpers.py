"""Small factories and probes shared by the integration tests."""

from __future__ import annotations

import functools
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy import text as sql_text

from evaluation.runner import HttpPoster
from shared.db import unit_of_work
from shared.models import Chunk, Document, EsOutbox
from shared.queue import TaskQueue
from shared.settings import get_settings
from shared.stores.compose import connect
from shared.stores.elastic import get_es
from tests.conftest import wait_for

BRPOP_TIMEOUT_S = 1.0  # kombu's Redis transport (brpop_timeout)


@functools.cache
def suite_queue() -> TaskQueue:
    """The task queue the suite's workers consume, as a composition root builds it."""
    return connect().queue


class RecordingQueue:
    """The suite's task queue, with the calls of the ``recorded`` methods kept in ``calls``
    (their arguments) and, with ``send``, sent on as well."""

    def __init__(self, *recorded: str, send: bool = True) -> None:
        self.calls: dict[str, list[tuple[Any, ...]]] = {name: [] for name in recorded}
        self.send = send

    def __getattr__(self, name: str) -> Any:
        real = getattr(suite_queue(), name)
        if name not in self.calls:
            return real

        def record(*args: Any) -> Any:
            self.calls[name].append(args)
            return real(*args) if self.send else True

        return record


def upload_text(
    client: TestClient,
    auth: dict[str, str],
    external_id: str,
    text: str,
    title: str = "",
    **extra: Any,
) -> dict[str, Any]:
    response = client.post(
        "/v1/documents",
        headers=auth,
        json={"external_id": external_id, "text": text, "title": title, **extra},
    )
    assert response.status_code in (200, 202), response.text
    return dict(response.json())


def wait_job(
    client: TestClient,
    auth: dict[str, str],
    job_id: str,
    state: str = "indexed",
    timeout: float = 90,
) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        body = client.get(f"/v1/jobs/{job_id}", headers=auth).json()
        return body if body["state"] == state else None

    return dict(wait_for(done, timeout, what=f"job {job_id} to reach {state}"))


def pg_chunks(tenant: str) -> dict[str, int]:
    with unit_of_work() as uow:
        rows = uow.session.execute(
            select(Chunk.id, Chunk.version).where(Chunk.tenant_id == tenant)
        ).all()
    return {cid: version for cid, version in rows}


def es_chunks(tenant: str) -> dict[str, int]:
    es = get_es()
    alias = get_settings().es_chunks_alias()
    es.indices.refresh(index=alias)
    hits = es.search(
        index=alias, query={"term": {"tenant_id": tenant}}, size=10_000, version=True, source=False
    )["hits"]["hits"]
    return {hit["_id"]: hit["_version"] for hit in hits}


def outbox_empty() -> bool:
    with unit_of_work() as uow:
        return (uow.session.scalar(select(func.count()).select_from(EsOutbox)) or 0) == 0


def jobs_in_flight(tenant: str) -> int:
    from shared.models import IngestJob

    with unit_of_work() as uow:
        return (
            uow.session.scalar(
                select(func.count())
                .select_from(IngestJob)
                .where(IngestJob.tenant_id == tenant, IngestJob.state.in_(["queued", "running"]))
            )
            or 0
        )


def wait_converged(tenant: str, timeout: float = 60) -> dict[str, int]:
    """Until no job of the tenant is in flight and Elasticsearch holds exactly Postgres's
    chunks at Postgres's versions."""

    def converged() -> dict[str, int] | None:
        if jobs_in_flight(tenant):
            return None
        pg = pg_chunks(tenant)
        return pg if outbox_empty() and es_chunks(tenant) == pg else None

    try:
        return dict(
            wait_for(converged, timeout, interval=0.5, what=f"stores to agree for {tenant}")
        )
    except AssertionError as e:
        with unit_of_work() as uow:
            backlog = uow.session.execute(
                select(EsOutbox.chunk_id, EsOutbox.op, EsOutbox.version, EsOutbox.last_error)
            ).all()
        raise AssertionError(
            f"{e}\npostgres: {pg_chunks(tenant)}\nelasticsearch: {es_chunks(tenant)}\n"
            f"outbox: {backlog[:10]}"
        ) from None


def document_count(tenant: str) -> int:
    with unit_of_work() as uow:
        return (
            uow.session.scalar(
                select(func.count()).select_from(Document).where(Document.tenant_id == tenant)
            )
            or 0
        )


def job_state(job_id: str) -> tuple[str, dict[str, Any], str | None]:
    import uuid

    from shared.models import IngestJob

    with unit_of_work() as uow:
        job = uow.session.get(IngestJob, uuid.UUID(job_id))
        assert job is not None
        return job.state, dict(job.detail), job.error_message


def search(client: TestClient, auth: dict[str, str], query: str, **options: Any) -> dict[str, Any]:
    response = client.post("/v1/search", headers=auth, json={"query": query, **options})
    assert response.status_code == 200, response.text
    return dict(response.json())


def long_text(topic: str, sentences: int = 60) -> str:
    return " ".join(
        f"Paragraph {i} of the {topic} report explains detail number {i} at some length."
        for i in range(sentences)
    )


PAUSE_TRIES = 20


@contextmanager
def paused(worker: Any) -> Iterator[None]:
    """SIGSTOP the worker (all its processes) so the test decides what runs, and in what order.

    A worker stopped while its BRPOP waits on Redis would still be handed the next message
    published within that BRPOP's timeout (kombu's 1 s) and sit on it until it is resumed:
    so the block starts only once any such wait has run out.

    A worker stopped inside a Postgres transaction would keep its locks until resumed: a
    partition move holds ``documents`` in SHARE ROW EXCLUSIVE mode, so every upload the
    block sends would wait on it, and the block would never end. So the worker is stopped
    only between transactions: if one of its processes has one open, it runs on a moment
    and is stopped again."""
    for _ in range(PAUSE_TRIES):
        os.killpg(worker.proc.pid, signal.SIGSTOP)
        time.sleep(BRPOP_TIMEOUT_S + 0.3)
        if not _open_transactions_of([worker.proc.pid, *worker.child_pids()]):
            break
        os.killpg(worker.proc.pid, signal.SIGCONT)
        time.sleep(0.5)
    else:
        raise AssertionError(f"the worker was inside a transaction at each of {PAUSE_TRIES} tries")
    try:
        yield
    finally:
        os.killpg(worker.proc.pid, signal.SIGCONT)


def _open_transactions_of(pids: list[int]) -> int:
    """Transactions open in Postgres for these processes (each connection names its process:
    shared/db._name_connection)."""
    with unit_of_work() as uow:
        return int(
            uow.session.execute(
                sql_text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE application_name = ANY(:names) AND xact_start IS NOT NULL"
                ),
                {"names": [f"concord-{pid}" for pid in pids]},
            ).scalar_one()
        )


def exhaust_attempts(job_id: str, last_error: str | None = None) -> None:
    """As if every allowed worker had died holding the job's lease."""
    import uuid

    from sqlalchemy import update

    from shared.models import IngestJob

    values: dict[str, Any] = {
        "state": "running",
        "attempts": get_settings().job_max_attempts,
        "lease_expires_at": IngestJob.created_at,
    }
    if last_error:
        values["error_message"] = last_error
    with unit_of_work() as uow:
        uow.session.execute(
            update(IngestJob).where(IngestJob.id == uuid.UUID(job_id)).values(**values)
        )


def tenant_index(tenant: str) -> str:
    """The tenant's own Elasticsearch index (its alias), created if it has none yet: where a
    test writes a copy straight into Elasticsearch, as the relay would."""
    from shared.stores.chunk_index import ElasticsearchChunkIndex
    from shared.stores.es_index import tenant_alias

    assert ElasticsearchChunkIndex().prepare([tenant]) == {}
    return tenant_alias(get_settings(), tenant)


def index_orphan(tenant: str, text: str = "ghost", title: str = "") -> str:
    """An Elasticsearch copy of a chunk Postgres never had (as the relay would shape it)."""
    ghost, document = orphan_copy(tenant, text, title)
    get_es().index(
        index=tenant_index(tenant),
        id=ghost,
        version=1,
        version_type="external",
        refresh=True,
        document=document,
    )
    return ghost


def orphan_copy(tenant: str, text: str = "ghost", title: str = "") -> tuple[str, dict[str, Any]]:
    """A chunk id Postgres never had, and its Elasticsearch copy as the relay shapes one."""
    import uuid

    from shared.stores.buckets import bucket_of
    from shared.stores.english_analysis import analyze

    ghost = f"{uuid.uuid4()}:0"
    return ghost, {
        "chunk_id": ghost,
        "tenant_id": tenant,
        "document_id": ghost[:36],
        "external_id": "ghost",
        "version": 1,
        "ordinal": 0,
        "text_hash": "0" * 64,
        "title": title,
        "section": "",
        "text": text,
        "stemmed": {"title": analyze(title), "section": "", "text": analyze(text)},
        "metadata": {},
        "bucket": bucket_of(ghost),
        "fingerprint": 0,
    }


def dead_lettered_upload(client: Any, auth: dict[str, str], worker: Any) -> tuple[str, int]:
    """Upload a document whose job then runs out of attempts: (job id, dead letter id)."""
    from shared.jobs import sweep
    from shared.models import DeadLetter

    with paused(worker):
        up = upload_text(client, auth, "phoenix.txt", "The phoenix rises again from its ashes.")
        exhaust_attempts(up["job_id"])
        sweep.sweep_expired_jobs(unit_of_work, suite_queue())
    assert wait_job(client, auth, up["job_id"], state="dead_lettered")
    with unit_of_work() as uow:
        letter_id = uow.session.scalar(select(DeadLetter.id).where(DeadLetter.ref == up["job_id"]))
    assert letter_id is not None
    return up["job_id"], letter_id


def outbox_dead_letter(
    tenant: str, chunk: str, error_class: str, message: str, attempts: int, payload: dict[str, Any]
) -> int:
    """A dead letter of the relay's, as it writes one for a write Elasticsearch refused."""
    from sqlalchemy import select

    from shared.jobs import repository as jobs_repo
    from shared.models import DeadLetter

    with unit_of_work() as uow:
        jobs_repo.add_dead_letter(
            uow.session,
            tenant_id=tenant,
            source="outbox",
            ref=chunk,
            stage="es_relay",
            error_class=error_class,
            message=message,
            attempts=attempts,
            payload=payload,
        )
        return int(uow.session.scalar(select(DeadLetter.id).where(DeadLetter.ref == chunk)))


def new_key(tenant: str, scopes: list[str]) -> str:
    """The secret of a new API key of ``tenant`` with ``scopes``."""
    from shared.tenants.service import create_key

    with unit_of_work() as uow:
        _, secret = create_key(uow.session, tenant, "test", scopes)
    return secret


def key_headers(tenant: str, scopes: list[str]) -> dict[str, str]:
    return {"Authorization": f"Bearer {new_key(tenant, scopes)}"}


def pdf_with_pages(pages: list[str]) -> bytes:
    """A valid PDF with each string as one page's text layer (Helvetica, uncompressed)."""
    n = len(pages)
    font = 3 + 2 * n
    kids = " ".join(f"{3 + 2 * i} 0 R" for i in range(n))
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        f"<< /Type /Pages /Kids [{kids}] /Count {n} >>".encode(),
    ]
    for i, text in enumerate(pages):
        escaped = text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
        stream = f"BT /F1 10 Tf 40 800 Td ({escaped}) Tj ET".encode()
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 842] /Contents {4 + 2 * i} 0 R "
            f"/Resources << /Font << /F1 {font} 0 R >> >> >>".encode()
        )
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    return pdf_of(objects)


def pdf_of(objects: list[bytes]) -> bytes:
    """A PDF of ``objects`` (object 1 the catalog), with a correct cross-reference table."""
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return bytes(out)


def pdf_drawing_nested_forms(depth: int = 8, fan: int = 10) -> bytes:
    """A one-page PDF of 2.5 KB whose page draws a form that draws the next ``fan`` times,
    ``depth`` levels deep: ten million draws of one letter at the defaults. PDFium, loading
    the page, took 27 s and 8 GB in one C call."""
    font = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"
    draw = b"/X Do"
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 842] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> /XObject << /X 6 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n%s\nendstream" % (len(draw), draw),
        font,
    ]
    for level in range(depth):
        if level < depth - 1:
            body = b" ".join([draw] * fan)
            resources = b"<< /XObject << /X %d 0 R >> /Font << /F1 5 0 R >> >>" % (7 + level)
        else:
            body = b"BT /F1 10 Tf 40 800 Td (x) Tj ET"
            resources = b"<< /Font << /F1 5 0 R >> >>"
        objects.append(
            b"<< /Type /XObject /Subtype /Form /BBox [0 0 612 842] /Resources %s /Length %d >>"
            b"\nstream\n%s\nendstream" % (resources, len(body), body)
        )
    return pdf_of(objects)


def pdf_with_lines(lines: list[str]) -> bytes:
    """A one-page PDF of ``lines``, one under another (Helvetica, uncompressed)."""
    shown = b" 0 -12 Td ".join(b"(%s) Tj" % line.encode() for line in lines)
    stream = b"BT /F1 10 Tf 40 800 Td " + shown + b" ET"
    return pdf_of(
        [
            b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 842] /Contents 4 0 R "
            b"/Resources << /Font << /F1 5 0 R >> >> >>",
            b"<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream),
            b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        ]
    )


def pdf_whose_error_quotes_a_nul() -> bytes:
    """A PDF whose page stream names an unknown filter holding a NUL (``#00``): pypdf failed
    on it with a message that quoted the name, NUL and all; PDFium reads its text."""
    return pdf_with_pages(["Unreadable."]).replace(b"<< /Length", b"<< /Filter /Bad#00x /Length")


TINY = Path(__file__).parent / "data" / "tiny-beir"  # a BEIR dataset of 8 queries


def poster(client: TestClient) -> HttpPoster:
    """A TestClient as the evaluation's HTTP client (it is an httpx client in all but its
    stubs)."""
    return cast(HttpPoster, client)


def progress_log() -> tuple[list[tuple[str, int, int]], Any]:
    """A progress callback that records (stage, done, total), and what it recorded."""
    log: list[tuple[str, int, int]] = []
    return log, lambda stage, done, total: log.append((stage, done, total))
