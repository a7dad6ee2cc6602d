"""Durable, idempotent, versioned ingestion on the real services."""

from __future__ import annotations

import time
import uuid
from typing import Any

from elasticsearch import ApiError
from fastapi.testclient import TestClient
from sqlalchemy import select

from shared.db import unit_of_work
from shared.documents.events import build_upload_event
from shared.ingest import pipeline
from shared.jobs import sweep
from shared.jobs.repository import live_job_states
from shared.models import Chunk, DeadLetter
from shared.queue import publish_upload_event
from shared.relay import service as relay
from shared.settings import get_settings
from shared.stores.compose import connect
from shared.stores.elastic import get_es
from tests.conftest import wait_for
from tests.helpers import (
    es_chunks,
    exhaust_attempts,
    job_state,
    key_headers,
    long_text,
    paused,
    pg_chunks,
    search,
    suite_queue,
    tenant_index,
    upload_text,
    wait_converged,
    wait_job,
)


def chunk_fingerprint(tenant: str) -> list[tuple[int, str, int]]:
    with unit_of_work() as uow:
        rows = uow.session.execute(
            select(Chunk.ordinal, Chunk.text_hash, Chunk.version)
            .where(Chunk.tenant_id == tenant)
            .order_by(Chunk.ordinal)
        ).all()
    return [(r.ordinal, r.text_hash, r.version) for r in rows]


def test_unchanged_reupload_is_a_noop_and_unchanged_chunks_are_never_reembedded(
    client: TestClient, auth, tenant, worker
):
    text = long_text("harbour")
    first = upload_text(client, auth, "harbour.txt", text)
    job = wait_job(client, auth, first["job_id"])
    before = wait_converged(tenant)
    assert job["detail"]["chunks"] == len(before) > 1

    again = client.post(
        "/v1/documents", headers=auth, json={"external_id": "harbour.txt", "text": text}
    )
    assert again.status_code == 200
    assert again.json() == {**first, "status": "unchanged"}
    assert pg_chunks(tenant) == before

    # The same text under another id: every chunk comes from the embedding cache.
    copy = upload_text(client, auth, "harbour-copy.txt", text)
    copy_job = wait_job(client, auth, copy["job_id"])
    assert copy_job["detail"]["cache_hits"] == copy_job["detail"]["chunks"]
    assert copy_job["detail"]["embedded"] == 0

    # A changed ending: a new version that re-embeds only the chunks that changed.
    changed = upload_text(client, auth, "harbour.txt", text + " A closing remark on tides.")
    assert changed["version"] == 2 and changed["document_id"] == first["document_id"]
    changed_job = wait_job(client, auth, changed["job_id"])
    assert changed_job["detail"]["embedded"] <= 2
    assert changed_job["detail"]["cache_hits"] >= changed_job["detail"]["chunks"] - 2


def test_update_removes_the_old_version_from_both_stores(client: TestClient, auth, tenant, worker):
    v1 = upload_text(client, auth, "policy.txt", long_text("xylophone"), title="Policy")
    wait_job(client, auth, v1["job_id"])
    assert len(wait_converged(tenant)) > 1

    v2 = upload_text(
        client, auth, "policy.txt", "The policy now covers marimbas only.", title="Policy"
    )
    wait_job(client, auth, v2["job_id"])
    chunks = wait_converged(tenant)
    assert set(chunks.values()) == {2} and len(chunks) == 1
    assert search(client, auth, "xylophone report", mode="lexical")["results"] == []
    hits = search(client, auth, "xylophone report")["results"]
    assert all(h["version"] == 2 for h in hits)
    doc = client.get(f"/v1/documents/{v1['document_id']}", headers=auth).json()
    assert doc["version"] == 2 and doc["chunk_count"] == 1
    assert doc["elasticsearch"]["in_sync"] is True


def _index_stale(tenant: str, chunk_id: str, source: dict[str, Any], version: int) -> int:
    """Replay a write as a late relay would: the old text at its old external version."""
    es = get_es()
    try:
        es.index(
            index=tenant_index(tenant),
            id=chunk_id,
            document=source,
            version=version,
            version_type="external",
            refresh=True,
        )
    except ApiError as e:  # ConflictError (409) is the one we expect
        return int(e.meta.status)
    return 201


def test_delete_and_stale_replays_never_resurrect(client: TestClient, auth, tenant, worker):
    up = upload_text(client, auth, "secret.txt", "Project quetzalcoatl launches in spring.")
    wait_job(client, auth, up["job_id"])
    [chunk_id] = wait_converged(tenant)
    es = get_es()
    alias = tenant_index(tenant)
    stale_source = es.get(index=alias, id=chunk_id)["_source"]

    deleted = client.delete(f"/v1/documents/{up['document_id']}", headers=auth)
    assert deleted.status_code == 200 and deleted.json()["version"] == 2
    assert wait_converged(tenant) == {}
    assert client.delete(f"/v1/documents/{up['document_id']}", headers=auth).status_code == 404

    # Within gc_deletes, Elasticsearch's tombstone (version 2) rejects the stale write.
    assert _index_stale(tenant, chunk_id, stale_source, 1) == 409
    # Re-delivering the original job does nothing either.
    suite_queue().publish_ingest_job(uuid.UUID(up["job_id"]))
    time.sleep(2)
    assert es_chunks(tenant) == {} and pg_chunks(tenant) == {}

    # Past gc_deletes, Elasticsearch has forgotten the tombstone and accepts the stale write;
    # the read path must still never serve it, and must get it removed.
    index = next(iter(es.indices.get_alias(name=alias)))
    es.indices.put_settings(index=index, settings={"index.gc_deletes": "0s"})
    try:

        def accepted() -> bool:
            es.indices.refresh(index=alias)
            return _index_stale(tenant, chunk_id, stale_source, 1) == 201

        wait_for(accepted, 30, interval=1, what="ES to forget the tombstone")
    finally:
        es.indices.put_settings(index=index, settings={"index.gc_deletes": "60s"})
    assert chunk_id in es_chunks(tenant)
    found = search(client, auth, "quetzalcoatl", mode="lexical")
    assert found["results"] == [] and found["dropped_stale"] == 1
    assert wait_converged(tenant) == {}, "the read path queued the orphan for deletion"


def test_out_of_order_and_duplicate_deliveries_end_as_one_delivery(
    client: TestClient, auth, tenant, worker
):
    control = upload_text(client, auth, "control.txt", long_text("lighthouse", 30) + " v2")
    wait_job(client, auth, control["job_id"])
    expected = [(o, h, 1) for o, h, _ in chunk_fingerprint(tenant)]
    client.delete(f"/v1/documents/{control['document_id']}", headers=auth)
    wait_converged(tenant)

    with paused(worker):  # deliveries below happen in our order
        v1 = upload_text(client, auth, "beacon.txt", long_text("lighthouse", 30) + " v1")
        v2 = upload_text(client, auth, "beacon.txt", long_text("lighthouse", 30) + " v2")
        # v2 first; v1 runs after it (in v2's batch, or on its own delivery).
        late = pipeline.process_job(connect(), unit_of_work, uuid.UUID(v2["job_id"]))
        pipeline.process_job(connect(), unit_of_work, uuid.UUID(v1["job_id"]))
        duplicate = pipeline.process_job(connect(), unit_of_work, uuid.UUID(v2["job_id"]))
        relay.drain(connect(), unit_of_work)
    assert late.state == "indexed"
    state, detail, _ = job_state(v1["job_id"])
    assert state == "indexed" and detail["superseded_by"] == 2
    assert duplicate.detail == {"duplicate_delivery": True}
    # The queued messages for both jobs are delivered too (more duplicates).
    wait_for(lambda: job_state(v1["job_id"])[0] == job_state(v2["job_id"])[0] == "indexed", 30)
    chunks = wait_converged(tenant)
    assert set(chunks.values()) == {2}
    assert [(o, h) for o, h, _ in chunk_fingerprint(tenant)] == [(o, h) for o, h, _ in expected]


def test_a_delivery_for_a_job_running_under_a_live_lease_leaves_it_alone(
    client: TestClient, auth, tenant, worker
):
    from datetime import timedelta

    from sqlalchemy import func, update

    from shared.models import IngestJob

    with paused(worker):
        upload = upload_text(client, auth, "leased.txt", long_text("quay", 10))
        with unit_of_work() as uow:  # as if another worker's batch held it
            uow.session.execute(
                update(IngestJob)
                .where(IngestJob.id == uuid.UUID(upload["job_id"]))
                .values(state="running", lease_expires_at=func.now() + timedelta(seconds=2))
            )
        outcome = pipeline.process_job(connect(), unit_of_work, uuid.UUID(upload["job_id"]))
        assert outcome.state == "running" and outcome.detail == {"leased_elsewhere": True}
        assert job_state(upload["job_id"])[0] == "running" and pg_chunks(tenant) == {}
    # Once the lease has run out, the next delivery (its own message, or the sweep's) takes
    # it, and it ends indexed.
    time.sleep(2.5)
    sweep.sweep_expired_jobs(unit_of_work, suite_queue())
    wait_job(client, auth, upload["job_id"])
    assert len(wait_converged(tenant)) > 0


def test_a_delivery_whose_job_is_not_next_in_fair_order_leaves_it_queued_for_its_turn(
    client: TestClient, auth, tenant, worker
):
    """A message is a wake-up: its batch is the next work in fair order, which need not
    hold the message's own job. That job waits its turn, queued (its message at the back of
    the queue again); the task once failed on it with a KeyError and dead-lettered it."""
    small_batches = get_settings().model_copy(update={"ingest_batch_bytes": 1000})
    with paused(worker):
        first, second = (
            upload_text(client, auth, f"{word}.txt", long_text(word, 20))["job_id"]
            for word in ("alder", "birch")
        )  # about 1,600 bytes each: one is a batch of its own
        outcome = pipeline.process_job(connect(), unit_of_work, uuid.UUID(second), small_batches)
        assert (outcome.state, outcome.detail) == ("queued", {"waits_its_turn": True})
        assert job_state(second)[0] == "queued"
        assert job_state(first)[0] == "indexed"  # the older one, first in fair order
    wait_job(client, auth, second)
    assert job_state(second)[0] == "indexed"


def test_a_failed_batch_run_for_another_jobs_message_leaves_that_job_queued(
    client: TestClient, auth, tenant, worker, monkeypatch
):
    """The batch a message's task runs need not hold the message's job; when that batch
    fails for a reason a retry may fix, the error is not the job's: its task raised it, was
    retried, and with its retries spent dead-lettered a job that never ran."""
    from sqlalchemy.exc import OperationalError

    def store_away(*args, **kwargs):
        raise OperationalError("embed", {}, Exception("connection refused"))

    small_batches = get_settings().model_copy(update={"ingest_batch_bytes": 1000})
    with paused(worker):
        first, second = (
            upload_text(client, auth, f"{word}.txt", long_text(word, 20))["job_id"]
            for word in ("rowan", "aspen")
        )
        monkeypatch.setattr(pipeline, "embed_step", store_away)
        outcome = pipeline.process_job(connect(), unit_of_work, uuid.UUID(second), small_batches)
        monkeypatch.undo()
        assert (outcome.state, outcome.detail) == ("queued", {"waits_its_turn": True})
        assert job_state(second)[0] == "queued"
        assert job_state(first)[0] == "queued"  # the batch's own job, handed back
    for job in (first, second):
        wait_job(client, auth, job)
        assert job_state(job)[0] == "indexed"


def test_a_batch_given_up_while_postgres_is_away_is_handed_back_when_it_returns(
    client: TestClient, auth, tenant, worker, monkeypatch
):
    """Postgres goes away after a batch is claimed: the batch cannot hand its jobs back, so
    they are owed, and the process's next task hands them back first once Postgres is there
    again, instead of every job waiting out its lease (job_lease_seconds, 20 s: after a 10 s
    outage under the defaults that wait was most of the recovery). A job claimed again since
    by another worker is not the owing batch's to hand back."""
    from contextlib import contextmanager

    from sqlalchemy import func, update
    from sqlalchemy.exc import OperationalError

    from shared.errors import StoreUnavailable
    from shared.models import IngestJob

    monkeypatch.setattr(pipeline, "_owed_releases", {})
    calls = {"n": 0}

    @contextmanager
    def postgres_away_after_the_claim():  # the first transaction (the claim) goes through
        calls["n"] += 1
        if calls["n"] > 1:
            raise OperationalError("connect", {}, Exception("connection refused"))
        with unit_of_work() as uow:
            yield uow

    with paused(worker):
        ids = [
            upload_text(client, auth, f"owed-{i}.txt", long_text(word, 3))["job_id"]
            for i, word in enumerate(("heron", "egret", "bittern"))
        ]
        try:
            pipeline.process_job(connect(), postgres_away_after_the_claim, uuid.UUID(ids[0]))
            raise AssertionError("the batch went on without Postgres")
        except (OperationalError, StoreUnavailable):  # the driver's, or a store adapter's
            pass
        states = {j: job_state(j)[0] for j in ids}
        assert states == {j: "running" for j in ids}  # leased still, and owed
        assert set(pipeline._owed_releases) == {uuid.UUID(j) for j in ids}
        with unit_of_work() as uow:  # the third taken over meanwhile by another worker
            uow.session.execute(  # (a replay resets attempts: the claim's start tells)
                update(IngestJob)
                .where(IngestJob.id == uuid.UUID(ids[2]))
                .values(started_at=func.now())
            )
        # Postgres is back: the next task (here a delivery of the first job) hands the
        # owed jobs back before it claims, and runs the first one at once.
        outcome = pipeline.process_job(connect(), unit_of_work, uuid.UUID(ids[0]))
        assert outcome.state == "indexed"
        assert pipeline._owed_releases == {}
        assert job_state(ids[2])[0] == "running"  # the other worker's, left alone
    wait_job(client, auth, ids[1])  # handed back with a message of its own
    assert job_state(ids[1])[0] == "indexed"


def test_unparseable_files_fail_with_a_reason_and_others_proceed(
    client: TestClient, auth, tenant, worker
):
    bad = {
        "empty.html": (
            b"<html><body><script>x()</script><nav>Menu</nav></body></html>",
            "text/html",
            "no text",
        ),
        "latin1.txt": ("Café crème brûlée".encode("latin-1"), "text/plain", "UTF-8"),
    }
    jobs = {}
    for name, (raw, content_type, _) in bad.items():
        response = client.post(
            "/v1/documents", headers=auth, files={"file": (name, raw, content_type)}
        )
        assert response.status_code == 202, response.text
        jobs[name] = response.json()["job_id"]
    # Upload events go through the same intake check as the API: a broken PDF is refused there
    # (a dead letter with the reason, as the API answers 422); a 0-byte file reaches a job,
    # which fails with a reason.
    publish_upload_event(
        build_upload_event(tenant_id=tenant, external_id="zero.txt", raw=b"", filename="zero.txt")
    )
    publish_upload_event(
        build_upload_event(
            tenant_id=tenant,
            external_id="broken.pdf",
            raw=b"%PDF-1.4\n1 0 obj << /Type /Catalog >> garbage",
            filename="broken.pdf",
        )
    )
    good = upload_text(client, auth, "good.txt", "Gannets dive from thirty metres.")
    wait_job(client, auth, good["job_id"])
    for name, job_id in jobs.items():
        body = wait_job(client, auth, job_id, state="failed")
        assert body["error"]["stage"] == "parse"
        assert bad[name][2] in body["error"]["message"]

    def events_done() -> tuple[str, str] | None:
        with unit_of_work() as uow:
            states = live_job_states(uow.session, tenant, ["zero.txt", "broken.pdf"])
            letter = uow.session.execute(
                select(DeadLetter.source, DeadLetter.message).where(
                    DeadLetter.tenant_id == tenant, DeadLetter.ref == "broken.pdf"
                )
            ).first()
        done = states == {"zero.txt": "failed"} and letter is not None
        return (letter[0], letter[1]) if done and letter is not None else None

    source, message = wait_for(events_done, 30, what="the 0-byte job failed, the PDF refused")
    assert source == "event" and "PDF" in message
    assert len(wait_converged(tenant)) == 1


def test_exhausted_attempts_are_dead_lettered_with_the_reason(
    client: TestClient, auth, tenant, worker
):
    with paused(worker):
        up = upload_text(client, auth, "doomed.txt", "This job keeps losing its worker.")
        exhaust_attempts(up["job_id"], last_error="WorkerLostError: SIGKILL")
        report = sweep.sweep_expired_jobs(unit_of_work, suite_queue())
    assert up["job_id"] in report.dead_lettered
    body = client.get(f"/v1/jobs/{up['job_id']}", headers=auth).json()
    assert body["state"] == "dead_lettered"
    assert "WorkerLostError" in body["error"]["message"]
    with unit_of_work() as uow:
        letter = uow.session.scalar(select(DeadLetter).where(DeadLetter.ref == up["job_id"]))
        assert letter is not None and letter.attempts == get_settings().job_max_attempts
        assert letter.stage == "lease" and letter.tenant_id == tenant


def test_a_document_of_too_many_chunks_fails_alone_and_its_batch_mates_are_indexed(
    client: TestClient, auth, tenant, worker
):
    """One batch: a markdown file of more sections than a document may make chunks, 4 KB of
    nested tables (which once parsed into 600 KB of text), and another tenant's ordinary
    upload. The first fails with the reason before anything is embedded; the others are
    indexed, the tables as the one line of text they hold."""
    other = f"{tenant}-b"
    other_auth = key_headers(other, ["read", "write"])
    many = "".join(  # sections of a chunk each: more than a stub, which joins its neighbour
        f"# Heading {i}\nWords of section {i}, which says one more thing about the survey and "
        "the method that led its authors to what they concluded in the end.\n"
        for i in range(30)
    ).encode()
    tables = b"<html><body>" + b"<table><tr><td>" * 300 + b"Terns migrate far." * 10

    def post(headers: dict[str, str], name: str, raw: bytes, content_type: str) -> uuid.UUID:
        response = client.post(
            "/v1/documents", headers=headers, files={"file": (name, raw, content_type)}
        )
        assert response.status_code == 202, response.text
        return uuid.UUID(response.json()["job_id"])

    with paused(worker):
        jobs = {
            "many": post(auth, "many.md", many, "text/markdown"),
            "tables": post(auth, "tables.html", tables, "text/html"),
            "fine": post(other_auth, "fine.txt", b"Puffins nest in burrows.", "text/plain"),
        }
        settings = get_settings().model_copy(update={"max_chunks_per_document": 20})
        outcomes = pipeline.process_jobs(connect(), unit_of_work, list(jobs.values()), settings)
    states = {name: outcomes[job].state for name, job in jobs.items()}
    assert states == {"many": "failed", "tables": "indexed", "fine": "indexed"}
    failed = wait_job(client, auth, str(jobs["many"]), state="failed")
    assert failed["error"]["stage"] == "chunk" and "the limit is 20" in failed["error"]["message"]
    assert outcomes[jobs["tables"]].detail["chunks"] == 1
    wait_converged(tenant)
    assert len(wait_converged(other)) == 1


def test_a_batch_writes_its_first_jobs_before_it_encodes_the_rest(
    client: TestClient, auth: dict[str, str], tenant: str, worker: Any, monkeypatch: Any
) -> None:
    """Before, a batch's jobs were all encoded before any was written, so another
    tenant's one-line upload, first in the batch's fair order, waited for its batch-mates'
    encoding (7 s of a 256 KiB batch on this machine). A batch is encoded and written a group
    at a time in its order (groups of one job here)."""
    monkeypatch.setattr(pipeline, "WRITE_GROUP_CHUNKS", 1)
    events: list[tuple[str, set[uuid.UUID]]] = []
    embed, write = pipeline.embed_step, pipeline.write_batch

    def spied_embed(batch: list[Any], *args: Any, **kwargs: Any) -> Any:
        events.append(("embed", {c.claim.job_id for c in batch}))
        return embed(batch, *args, **kwargs)

    def spied_write(uow: Any, batch: list[Any], vectors: Any, queue: Any) -> dict[uuid.UUID, Any]:
        events.append(("write", {e.claim.job_id for e in batch}))
        return write(uow, batch, vectors, queue)

    monkeypatch.setattr(pipeline, "embed_step", spied_embed)
    monkeypatch.setattr(pipeline, "write_batch", spied_write)
    with paused(worker):
        note = upload_text(
            client, key_headers(f"{tenant}-other", ["read", "write"]), "n.txt", "Tides turn."
        )["job_id"]
        backlog = [
            upload_text(client, auth, f"{word}.txt", long_text(word, 40))["job_id"]
            for word in ("estuary", "ferry", "harbour")
        ]
        with unit_of_work() as uow:
            claims = pipeline.claim(uow, uuid.UUID(note), get_settings(), queue=suite_queue())
        assert not isinstance(claims, pipeline.JobOutcome), claims
        order = [c.job_id for c in claims]
        assert order[0] == uuid.UUID(note) and set(map(uuid.UUID, backlog)) <= set(order)
        outcomes = pipeline.run(connect(), claims, unit_of_work, get_settings())
    assert {outcomes[uuid.UUID(j)].state for j in [note, *backlog]} == {"indexed"}
    note_written = events.index(("write", {uuid.UUID(note)}))
    last_embedded = events.index(("embed", {order[-1]}))
    assert note_written < last_embedded, events


def test_a_document_larger_than_a_turn_is_encoded_a_turn_at_a_time_with_others_between(
    client: TestClient, auth: dict[str, str], tenant: str, worker: Any
) -> None:
    """Before, a document over the batch's budget was a batch of its own that held a worker
    for as long as it took (30 documents of 600 KB kept another tenant's upload out for 130 s).
    A turn encodes at most ``ingest_turn_chunks`` chunks; a document with more goes back to
    the queue with those cached, and another tenant's job is claimed before its next turn.
    Its turns are not attempts, and the document is indexed whole, once."""
    from shared.jobs.repository import job_by_id

    settings = get_settings().model_copy(update={"ingest_turn_chunks": 16})
    text = " ".join(f"Sentence {i} of the long survey of tidal estuaries and ferries." * 4
                    for i in range(200))  # fmt: skip
    with paused(worker):
        big = upload_text(client, auth, "survey.txt", text)["job_id"]
        other = upload_text(
            client, key_headers(f"{tenant}-other", ["read", "write"]), "n.txt", "Tides turn."
        )["job_id"]
        turns, claimed_between = 0, False
        while True:
            turns += 1
            with unit_of_work() as uow:
                claims = pipeline.claim(uow, uuid.UUID(big), settings, queue=suite_queue())
            assert not isinstance(claims, pipeline.JobOutcome), claims
            claimed_between |= uuid.UUID(other) in {c.job_id for c in claims}
            outcomes = pipeline.run(connect(), claims, unit_of_work, settings)
            state = outcomes[uuid.UUID(big)].state if uuid.UUID(big) in outcomes else None
            if state == "indexed":
                break
            assert state == "queued" and outcomes[uuid.UUID(big)].detail["left_to_encode"] > 0
            assert turns < 20
        with unit_of_work() as uow:
            job = job_by_id(uow.session, uuid.UUID(big))
            assert job is not None and job.attempts == 1
    assert turns >= 3 and claimed_between
    chunks = wait_converged(tenant)
    assert len(chunks) == outcomes[uuid.UUID(big)].detail["chunks"]
