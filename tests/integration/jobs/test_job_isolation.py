"""One tenant's input never harms another's work: a batch holds jobs of many
tenants, and an error that belongs to one job fails that job alone.

Each test puts an offending tenant's jobs and a victim tenant's ordinary jobs into the same
claimed batch (the worker is paused while both upload), then checks that every victim job
ends indexed in both stores, and that the offender's jobs end failed or dead-lettered with a
stage, a class and a message that carries none of the victim's data. Input that is valid but
unusual must not harm the victim either: its vectors are the ones its texts get alone."""

from __future__ import annotations

import json
import uuid
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy import text as sql
from sqlalchemy.exc import DataError

from shared.db import unit_of_work
from shared.db.repository import lock_key
from shared.ingest import pipeline, steps
from shared.ingest.embedding import get_embedder
from shared.models import Chunk, DeadLetter, Document, IngestJob
from shared.settings import get_settings
from shared.stores import repository as repo
from shared.stores.compose import connect
from tests.conftest import CeleryProcess, wait_for
from tests.helpers import key_headers, paused, suite_queue, upload_text, wait_converged

VICTIM_MARKER = "kestrel-victim-secret"


def _victim_uploads(
    client: TestClient, auth: dict[str, str], n: int = 8, run: str = ""
) -> list[str]:
    """``run``: a word that makes the texts new to the embedding cache (shared by tenants)."""
    return [
        upload_text(
            client,
            auth,
            f"victim-{i}.txt",
            f"Ordinary note {i} about the {VICTIM_MARKER} river survey{run}. It has two sentences.",
        )["job_id"]
        for i in range(n)
    ]


def _jobs(job_ids: list[str]) -> dict[str, IngestJob]:
    with unit_of_work() as uow:
        jobs = uow.session.scalars(
            select(IngestJob).where(IngestJob.id.in_([uuid.UUID(j) for j in job_ids]))
        ).all()
    return {str(j.id): j for j in jobs}


def _wait_finished(job_ids: list[str], timeout: float = 120) -> dict[str, IngestJob]:
    def finished() -> dict[str, IngestJob] | None:
        jobs = _jobs(job_ids)
        done = all(j.state in ("indexed", "failed", "dead_lettered") for j in jobs.values())
        return jobs if done and len(jobs) == len(job_ids) else None

    return dict(wait_for(finished, timeout, what="every job to finish"))


def _assert_victim_unharmed(victim: str, victim_jobs: list[str]) -> None:
    jobs = _wait_finished(victim_jobs)
    assert {j.state for j in jobs.values()} == {"indexed"}, {
        k: (j.state, j.error_message) for k, j in jobs.items()
    }
    chunks = wait_converged(victim)
    assert len(chunks) == len(victim_jobs)


def _assert_failed_alone(job: IngestJob) -> None:
    assert job.state in ("failed", "dead_lettered"), job.state
    assert job.error_stage and job.error_class and job.error_message
    assert VICTIM_MARKER not in job.error_message
    assert "[SQL:" not in job.error_message and "parameters" not in job.error_message


POISON_JSON = {
    # json.loads refuses more than 4,300 digits with a ValueError, not a JSONDecodeError.
    "digits": '{"text": "a long number follows", "n": ' + "9" * 5000 + "}",
    # Nested past Python's recursion limit: a RecursionError.
    "nesting": '{"text": "deeply nested", "x": ' + "[" * 5000 + "]" * 5000 + "}",
}


def _stored_past_the_door(tenant: str, external_id: str, text: str) -> tuple[str, str]:
    """Accept an upload without the intake check (as content accepted before the check
    existed, or a bound raised since); returns (status, job id) and publishes the job."""
    from shared.documents.schemas import Upload
    from shared.documents.service import accept_upload

    upload = Upload(tenant, external_id, text.encode(), "application/json")
    with unit_of_work() as uow:
        result = accept_upload(uow, get_settings(), upload, queue=suite_queue())
    return result.status, str(result.job_id)


def test_poison_json_is_refused_at_the_door_and_fails_alone_past_it(
    client: TestClient, worker: CeleryProcess
) -> None:
    victim, offender = f"v-{uuid.uuid4().hex[:10]}", f"o-{uuid.uuid4().hex[:10]}"
    victim_auth = key_headers(victim, ["read", "write"])
    offender_auth = key_headers(offender, ["read", "write"])
    for name, text in POISON_JSON.items():  # the intake check: 422 with the reason
        refused = client.post(
            "/v1/documents",
            headers=offender_auth,
            json={"external_id": f"{name}.json", "text": text, "content_type": "application/json"},
        )
        assert refused.status_code == 422, refused.text
        assert "JSON" in refused.json()["error"]["message"]
    with paused(worker):
        poison_jobs = {
            name: _stored_past_the_door(offender, f"{name}.json", text)[1]
            for name, text in POISON_JSON.items()
        }
        # NUL and a lone surrogate, written as JSON escapes, reach the parsed text.
        odd = upload_text(
            client,
            offender_auth,
            "odd.json",
            '{"text": "a NUL \\u0000 here and a lone surrogate \\ud800 there."}',
            content_type="application/json",
        )["job_id"]
        victim_jobs = _victim_uploads(client, victim_auth)
    _assert_victim_unharmed(victim, victim_jobs)
    jobs = _wait_finished([*poison_jobs.values(), odd])
    for name, job_id in poison_jobs.items():
        job = jobs[job_id]
        _assert_failed_alone(job)
        assert job.state == "failed" and job.error_stage == "parse", (name, job.error_message)
    # Text Postgres and the tokenizer cannot take is made storable at the same offsets.
    assert jobs[odd].state == "indexed", jobs[odd].error_message

    # The same content again is a retry of the failed version, not "unchanged".
    status, job_id = _stored_past_the_door(offender, "digits.json", POISON_JSON["digits"])
    assert status == "accepted" and job_id != poison_jobs["digits"]
    retried = _wait_finished([job_id])[job_id]
    assert retried.state == "failed" and retried.version == jobs[poison_jobs["digits"]].version


def _claims_of(job_ids: list[str]) -> list[Any]:
    """A batch holding ``job_ids`` (small jobs: all of them fit), as a message of them claims."""
    with unit_of_work() as uow:
        listed = [uuid.UUID(j) for j in job_ids]
        claims, rest = pipeline.claim_listed(uow, listed, get_settings(), queue=suite_queue())
    assert rest == []
    return claims


@pytest.mark.parametrize("stage", ["parse", "write", "unrecordable"])
def test_an_unexpected_error_of_one_job_dead_letters_it_alone(
    client: TestClient, worker: CeleryProcess, monkeypatch: pytest.MonkeyPatch, stage: str
) -> None:
    """Errors no one foresaw (a library's exception in the parser, a row the database
    refuses, an error whose own message the database refuses to record): the offender is
    dead-lettered with a message free of SQL and parameters, and its batch-mates of another
    tenant are indexed by the same batch."""
    victim, offender = f"v-{uuid.uuid4().hex[:10]}", f"o-{uuid.uuid4().hex[:10]}"
    victim_auth = key_headers(victim, ["read", "write"])
    offender_auth = key_headers(offender, ["read", "write"])

    if stage == "unrecordable":
        real_fail = pipeline.jobs.fail
        refusals: list[str] = []

        def fail(uow: Any, job_id: uuid.UUID, stage: str, error: Any, **options: Any) -> None:
            if not refusals:  # as Postgres refuses a message it cannot store
                refusals.append(str(error))
                raise DataError("UPDATE ingest_jobs ...", {}, Exception("invalid byte sequence"))
            real_fail(uow, job_id, stage, error, **options)

        monkeypatch.setattr(pipeline.jobs, "fail", fail)
    if stage in ("parse", "unrecordable"):
        real_parse = steps.parse

        def parse(raw: bytes, content_type: str, fields: tuple[str, ...]) -> Any:
            if b"offending" in raw:
                raise KeyError("a parser library's own exception")
            return real_parse(raw, content_type, fields)

        monkeypatch.setattr(steps, "parse", parse)
    else:
        real_upsert = repo.upsert_chunks

        def upsert(session: Any, versions: Any) -> None:
            if any(v.tenant_id == offender for v in versions):
                # As psycopg reports a value Postgres refuses: the statement and every row's
                # parameters travel in the exception's text.
                raise DataError(
                    "INSERT INTO chunks ...",
                    {"text": f"{VICTIM_MARKER} row"},
                    Exception("value out of range"),
                )
            real_upsert(session, versions)

        monkeypatch.setattr(repo, "upsert_chunks", upsert)

    with paused(worker):
        bad = upload_text(client, offender_auth, "bad.txt", "An offending document.")["job_id"]
        victim_jobs = _victim_uploads(client, victim_auth, n=4)
        outcomes = pipeline.run(
            connect(), _claims_of([bad, *victim_jobs]), unit_of_work, get_settings()
        )
        assert outcomes[uuid.UUID(bad)].state == "dead_lettered"
        assert {outcomes[uuid.UUID(j)].state for j in victim_jobs} == {"indexed"}
    _assert_victim_unharmed(victim, victim_jobs)
    job = _jobs([bad])[bad]
    _assert_failed_alone(job)
    assert (job.state, job.error_stage) == ("dead_lettered", stage.replace("unrecordable", "parse"))
    if stage == "unrecordable":
        assert job.error_class == "UnrecordedError" and "KeyError at parse" in job.error_message
    with unit_of_work() as uow:
        letter = uow.session.scalar(select(DeadLetter).where(DeadLetter.ref == bad))
    assert letter is not None and letter.tenant_id == offender
    assert VICTIM_MARKER not in letter.message and VICTIM_MARKER not in json.dumps(letter.payload)


def test_a_batch_that_runs_out_of_memory_loses_an_attempt_and_blames_no_one(
    client: TestClient, worker: CeleryProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A MemoryError met while parsing one job says nothing of that job: another tenant's
    document in the batch may hold the memory. It was charged to whichever job was being
    parsed, dead-lettered at once; now the batch goes back to the queue with an attempt lost
    by each job (so a document that exhausts memory alone soon runs alone), and the
    batch-mates are indexed."""
    victim, offender = f"v-{uuid.uuid4().hex[:10]}", f"o-{uuid.uuid4().hex[:10]}"
    real_parse = steps.parse

    def parse(raw: bytes, content_type: str, fields: tuple[str, ...]) -> Any:
        if b"unlucky" in raw:
            raise MemoryError()
        return real_parse(raw, content_type, fields)

    monkeypatch.setattr(steps, "parse", parse)  # in this process only, not the worker's
    with paused(worker):
        victim_jobs = _victim_uploads(client, key_headers(victim, ["read", "write"]), n=4)
        unlucky = upload_text(
            client, key_headers(offender, ["read", "write"]), "m.txt", "An unlucky document."
        )["job_id"]
        with pytest.raises(MemoryError):
            pipeline.run(
                connect(), _claims_of([*victim_jobs, unlucky]), unit_of_work, get_settings()
            )
        jobs = _jobs([*victim_jobs, unlucky])
        assert {(j.state, j.attempts_lost) for j in jobs.values()} == {("queued", 1)}
    _assert_victim_unharmed(victim, victim_jobs)
    assert _wait_finished([unlucky])[unlucky].state == "indexed"


def _a_backend_waits_for_a_document_lock() -> bool:
    """Whether a backend of this test database waits for a writer's lock (lock_keys')."""
    with unit_of_work() as uow:
        waiting = uow.session.execute(
            sql(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND wait_event = 'advisory' "
                "AND query LIKE '%pg_advisory_xact_lock%'"
            )
        ).scalar_one()
    return bool(waiting)


def test_an_upload_waiting_on_a_lock_does_not_stall_other_requests(live_api: str) -> None:
    """The upload route's transaction runs in a worker thread: while one upload waits for
    its document's lock (a slow writer of the same external id), the API keeps answering.
    A stalled API could not answer before the lock is let go, after the health check: the
    check would time out instead (no wall-clock bound: the suite's load varies)."""
    import threading

    import httpx

    tenant = f"slow-{uuid.uuid4().hex[:10]}"
    headers = key_headers(tenant, ["read", "write"])
    answered: dict[str, int] = {}

    def upload() -> None:
        body = {"external_id": "held.txt", "text": "Held behind a lock for a while."}
        answered["upload"] = httpx.post(
            f"{live_api}/v1/documents", headers=headers, json=body, timeout=60
        ).status_code

    with unit_of_work() as uow:  # a slow writer holds the external id's lock
        lock_key(uow.session, f"external:{tenant}:held.txt")
        waiting = threading.Thread(target=upload)
        waiting.start()
        wait_for(_a_backend_waits_for_a_document_lock, timeout=30, what="the upload to wait")
        health = httpx.get(f"{live_api}/healthz", timeout=30)
        assert health.status_code == 200 and "upload" not in answered  # answered meanwhile
    waiting.join(timeout=30)
    assert answered["upload"] == 202


def test_a_batch_mate_of_another_tenant_does_not_move_a_victims_vectors(
    client: TestClient, worker: CeleryProcess
) -> None:
    """The worker encodes a batch's new chunks together, whoever uploaded them: each chunk's
    stored vector must still be the one its own text gets alone. (int8's activations are
    quantized with one scale per encoder call: in a shared call, a long outlier of another
    tenant moved a victim's vectors to a cosine of about 0.988 with their own.)"""
    victim, offender = f"v-{uuid.uuid4().hex[:10]}", f"o-{uuid.uuid4().hex[:10]}"
    run = uuid.uuid4().hex[:8]  # new texts: encoded by this batch, not read from the cache
    with paused(worker):
        outlier = upload_text(
            client,
            key_headers(offender, ["read", "write"]),
            "outlier.txt",
            f"Run {run}. " + "A much longer passage about harbours, 1234567 tonnes! " * 30,
        )["job_id"]
        victim_jobs = _victim_uploads(
            client, key_headers(victim, ["read", "write"]), n=5, run=f" {run}"
        )
    _assert_victim_unharmed(victim, victim_jobs)
    assert _wait_finished([outlier])[outlier].state == "indexed"
    with unit_of_work() as uow:
        texts = dict(
            uow.session.execute(select(Chunk.id, Chunk.text).where(Chunk.tenant_id == victim)).all()
        )
        stored = repo.chunk_embeddings(uow.session, victim, list(texts))
    embedder = get_embedder()
    # the shipped encoder, int8 ONNX, and not a fallback to torch
    assert embedder.passage_encoding == "onnx-int8" and embedder.passage_encoder() is not None
    assert len(texts) == 5 and all(run in text for text in texts.values())
    for chunk_id, text in texts.items():
        alone = embedder.embed_passages([text])[0]
        assert np.allclose(stored[chunk_id], alone, rtol=0, atol=1e-5), (
            chunk_id,
            float(stored[chunk_id] @ alone),
        )


# A stand-in for a worker process that a document kills (a parser's crash, the OOM killer):
# it takes one job's message the way the task does, and SIGKILLs itself on parsing the pill.
CRASHER = """
import os, signal, sys, uuid
from shared.db import unit_of_work
from shared.ingest import pipeline, steps
from shared.stores.compose import connect

real_parse = steps.parse

def parse(raw, *args, **kwargs):
    if b"poison-pill" in raw:
        os.kill(os.getpid(), signal.SIGKILL)
    return real_parse(raw, *args, **kwargs)

steps.parse = parse
pipeline.process_job(connect(), unit_of_work, uuid.UUID(sys.argv[1]))
"""


def test_a_document_that_kills_its_worker_uses_up_its_own_attempts_not_its_batch_mates(
    client: TestClient, worker: CeleryProcess
) -> None:
    """The poison's message is delivered first every round, so it claims whoever is queued
    beside it. Each crash ends every job of its batch with no outcome of its own; a job that
    has lost two attempts runs alone from then on. The victim tenant's jobs lose at most two
    attempts and are indexed; the poison is dead-lettered alone after its five. (The lease
    running out is stood in for by back-dating it; the sweep is the real one. Once the poison
    is dead-lettered, the suite's warm worker indexes what is left: a fresh process per run
    loaded the model again for each, most of this test's time.)"""
    import subprocess
    import sys

    from sqlalchemy import text

    from shared.jobs.service import ISOLATE_AFTER_LOST_ATTEMPTS
    from shared.jobs.sweep import sweep_expired_jobs
    from tests.conftest import ROOT

    settings = get_settings()
    victim, offender = f"v-{uuid.uuid4().hex[:10]}", f"o-{uuid.uuid4().hex[:10]}"
    victim_auth = key_headers(victim, ["read", "write"])
    offender_auth = key_headers(offender, ["read", "write"])
    crashes, runs = 0, 0
    with paused(worker):
        victim_jobs = _victim_uploads(client, victim_auth, n=7, run=uuid.uuid4().hex[:6])
        poison = upload_text(client, offender_auth, "pill.txt", "A poison-pill document.")
        ours = [poison["job_id"], *victim_jobs]
        for _ in range(12):
            queued = [j for j in ours if _jobs([j])[j].state == "queued"]
            if not queued or poison["job_id"] not in queued:
                break
            for job_id in queued:  # the poison's message first
                runs += 1
                ended = subprocess.run(
                    [sys.executable, "-c", CRASHER, job_id], cwd=ROOT, timeout=120
                ).returncode
                if ended == -9:
                    crashes += 1
                    with unit_of_work() as uow:  # its leases run out (20 s under the defaults)
                        uow.session.execute(
                            text(
                                "UPDATE ingest_jobs SET lease_expires_at = now() - interval '1 s'"
                                " WHERE id = ANY(CAST(:ids AS uuid[])) AND state = 'running'"
                            ),
                            {"ids": ours},
                        )
                    sweep_expired_jobs(unit_of_work, suite_queue(), settings)
                    break
                assert ended == 0

    def victims_settled() -> dict[str, Any] | None:
        jobs = _jobs(ours)
        states = {jobs[j].state for j in victim_jobs}
        return jobs if states <= {"indexed", "failed", "dead_lettered"} else None

    jobs = wait_for(victims_settled, 120, what="the victims indexed by the worker")
    assert crashes == settings.job_max_attempts
    pill = jobs[poison["job_id"]]
    assert pill.state == "dead_lettered"
    assert f"({settings.job_max_attempts} ended with their worker lost" in pill.error_message
    for job_id in victim_jobs:
        job = jobs[job_id]
        assert job.state == "indexed", (job.state, job.error_message)
        assert job.attempts_lost <= ISOLATE_AFTER_LOST_ATTEMPTS
        assert job.attempts <= ISOLATE_AFTER_LOST_ATTEMPTS + 1
    print(f"\n[poison that kills its worker] {crashes} crashes in {runs} runs; victims indexed")
    _assert_victim_unharmed(victim, victim_jobs)


def test_a_row_over_a_postgres_limit_is_the_works_own_error_not_an_outage() -> None:
    """Postgres' "program limit exceeded" class (54: an index row too large) arrives from
    psycopg as an OperationalError, the class of an outage; retried, one job's row released
    its batch again and again and got the task's own job (any tenant's) dead-lettered."""
    from sqlalchemy import text
    from sqlalchemy.exc import OperationalError

    from shared.retry import is_retriable

    with pytest.raises(OperationalError) as raised, unit_of_work() as uow:
        uow.session.execute(text("CREATE TEMP TABLE limited (x text)"))
        uow.session.execute(text("CREATE INDEX ON limited (x)"))
        uow.session.execute(  # 32,000 characters no compression shrinks under 2,704 bytes
            text(
                "INSERT INTO limited"
                " SELECT string_agg(md5(i::text), '') FROM generate_series(1, 1000) i"
            )
        )
    assert getattr(raised.value.orig, "sqlstate", "").startswith("54")
    assert not is_retriable(raised.value)
    assert is_retriable(OperationalError("SELECT 1", {}, Exception("server closed the connection")))


def test_a_page_with_a_long_run_of_spaces_is_parsed_without_holding_its_batch(
    client: TestClient, worker: CeleryProcess
) -> None:
    """One tenant's HTML page with 200,000 spaces inside a paragraph, in one batch with
    another tenant's ordinary notes: both are indexed. (A regex that found a text node's edge
    whitespace backtracked over every run of spaces inside it: quadratic, minutes of the
    batch's time for this page.)"""
    victim, spacer = f"v-{uuid.uuid4().hex[:10]}", f"s-{uuid.uuid4().hex[:10]}"
    page = b"<html><body><p>Tide" + b" " * 200_000 + b"tables turn twice a day.</p></body></html>"
    with paused(worker):
        response = client.post(
            "/v1/documents",
            headers=key_headers(spacer, ["read", "write"]),
            files={"file": ("spaces.html", page, "text/html")},
        )
        assert response.status_code == 202, response.text
        spaced = response.json()["job_id"]
        victim_jobs = _victim_uploads(client, key_headers(victim, ["read", "write"]), n=5)
    _assert_victim_unharmed(victim, victim_jobs)
    assert _wait_finished([spaced])[spaced].state == "indexed"
    with unit_of_work() as uow:
        texts = uow.session.scalars(select(Chunk.text).where(Chunk.tenant_id == spacer)).all()
    assert list(texts) == ["Tide tables turn twice a day."]


def test_a_tenant_past_its_queued_bytes_waits_at_the_door_and_others_do_not(
    client: TestClient, worker: CeleryProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Queued ingest work is bounded per tenant (it was not before). A tenant whose queued raw bytes
    would pass ``ingest_tenant_queued_bytes`` is answered 429 with Retry-After (nothing of
    that upload is accepted), while another tenant's uploads in the same moment go in, and
    the first tenant's queued uploads are all indexed."""
    monkeypatch.setattr(get_settings(), "ingest_tenant_queued_bytes", 20_000)
    victim, flood = f"v-{uuid.uuid4().hex[:10]}", f"f-{uuid.uuid4().hex[:10]}"
    flood_auth = key_headers(flood, ["read", "write"])
    page = "Tide tables turn twice a day along the estuary, and the ferry waits. " * 120
    accepted, refused = [], []
    with paused(worker):
        for i in range(4):
            response = client.post(
                "/v1/documents",
                headers=flood_auth,
                json={"external_id": f"page-{i}", "text": f"{i} {page}"},
            )
            (accepted if response.status_code == 202 else refused).append(response)
        victim_jobs = _victim_uploads(client, key_headers(victim, ["read", "write"]), n=3)
    assert len(accepted) == 2 and len(refused) == 2, [r.status_code for r in refused]
    for response in refused:
        assert response.status_code == 429 and int(response.headers["Retry-After"]) > 0
        assert "CONCORD_INGEST_TENANT_QUEUED_BYTES" in response.json()["error"]["message"]
    _assert_victim_unharmed(victim, victim_jobs)
    jobs = _wait_finished([r.json()["job_id"] for r in accepted])
    assert {j.state for j in jobs.values()} == {"indexed"}
    with unit_of_work() as uow:
        documents = uow.session.scalars(
            select(Document.external_id).where(Document.tenant_id == flood)
        ).all()
    assert sorted(documents) == ["page-0", "page-1"]  # the refused ones were never accepted
