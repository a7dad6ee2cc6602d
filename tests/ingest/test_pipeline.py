"""Issue 3 acceptance: durable, idempotent, versioned ingestion on the real services."""

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
from shared.models import Chunk, DeadLetter, Document
from shared.outbox import service as relay
from shared.queue import publish_ingest_job, publish_upload_event
from shared.settings import get_settings
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
    publish_ingest_job(uuid.UUID(up["job_id"]))
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
        late = pipeline.process_job(unit_of_work, uuid.UUID(v2["job_id"]))
        pipeline.process_job(unit_of_work, uuid.UUID(v1["job_id"]))
        duplicate = pipeline.process_job(unit_of_work, uuid.UUID(v2["job_id"]))
        relay.drain(unit_of_work)
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
        outcome = pipeline.process_job(unit_of_work, uuid.UUID(upload["job_id"]))
        assert outcome.state == "running" and outcome.detail == {"leased_elsewhere": True}
        assert job_state(upload["job_id"])[0] == "running" and pg_chunks(tenant) == {}
    # Once the lease has run out, the next delivery (its own message, or the sweep's) takes
    # it, and it ends indexed.
    time.sleep(2.5)
    sweep.sweep_expired_jobs(unit_of_work)
    wait_job(client, auth, upload["job_id"])
    assert len(wait_converged(tenant)) > 0


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
        report = sweep.sweep_expired_jobs(unit_of_work)
    assert up["job_id"] in report.dead_lettered
    body = client.get(f"/v1/jobs/{up['job_id']}", headers=auth).json()
    assert body["state"] == "dead_lettered"
    assert "WorkerLostError" in body["error"]["message"]
    with unit_of_work() as uow:
        letter = uow.session.scalar(select(DeadLetter).where(DeadLetter.ref == up["job_id"]))
        assert letter is not None and letter.attempts == get_settings().job_max_attempts
        assert letter.stage == "lease" and letter.tenant_id == tenant


def test_cli_ingest_publishes_events_and_waits(client: TestClient, auth, tenant, worker, tmp_path):
    import subprocess
    import sys

    (tmp_path / "a.md").write_text("# Moss\nSphagnum moss holds twenty times its weight.")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.html").write_text("<h1>Lichen</h1><p>Lichens pioneer bare rock.</p>")
    (tmp_path / "sub" / "c.jsonl").write_text(
        '{"title": "Fern", "text": "Ferns spread by spores."}\n'
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "services.cli.main",
            "ingest",
            str(tmp_path),
            "--tenant",
            tenant,
            "--wait",
            "--timeout",
            "120",
        ],
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "published 3 upload event(s)" in result.stdout
    assert "indexed 3 of 3" in result.stdout
    wait_converged(tenant)
    assert search(client, auth, "pioneer bare rock")["results"][0]["section"] == "Lichen"
    # What `--wait` polls, for a directory of more documents than a statement has parameters
    # for (Postgres allows 65,535): one array parameter, not one per id.
    with unit_of_work() as uow:
        ids = list(
            uow.session.scalars(select(Document.external_id).where(Document.tenant_id == tenant))
        )
        many = [f"absent-{i}" for i in range(70_000)] + ids
        assert live_job_states(uow.session, tenant, many) == dict.fromkeys(ids, "indexed")
    assert len(ids) == 3


def test_metrics_cover_queue_outbox_dead_letters_and_stages(client: TestClient, worker):
    body = client.get("/metrics").text
    for name in (
        "concord_queue_depth",
        "concord_outbox_backlog",
        "concord_dead_letters",
        "concord_ingest_stage_seconds_count",
        "concord_jobs",
    ):
        assert name in body, name
    assert 'concord_ingest_stage_seconds_count{stage="embed"}' in body


def test_malformed_upload_events_are_dead_lettered_with_the_reason(tenant, worker):
    publish_upload_event(
        {
            "schema": "concord.upload/v1",
            "tenant_id": tenant,
            "external_id": "bad.bin",
            "content_base64": "!!!not base64!!!",
        }
    )

    def letter() -> DeadLetter | None:
        with unit_of_work() as uow:
            return uow.session.scalar(select(DeadLetter).where(DeadLetter.tenant_id == tenant))

    found = wait_for(letter, 30, what="the malformed event's dead letter")
    assert found.source == "event" and found.ref == "bad.bin"
    assert "base64" in found.message and "content_base64" not in found.payload


def test_events_published_together_are_accepted_together_and_indexed_as_one_batch(
    client: TestClient, auth, tenant, worker
):
    from shared.models import IngestJob
    from shared.queue import publish_upload_events

    def event(external_id: str, text: str) -> dict[str, Any]:
        return build_upload_event(tenant_id=tenant, external_id=external_id, raw=text.encode())

    publish_upload_events(
        [
            event("kelp.txt", "Kelp forests grow half a metre a day in cold water."),
            {"schema": "concord.upload/v1", "tenant_id": tenant, "external_id": "bad.bin"},
            event("coral.txt", "Corals build reefs from calcium carbonate over centuries."),
            event("kelp.txt", "Kelp forests grow half a metre a day in cold water."),  # same
        ]
    )

    def indexed() -> bool | None:
        with unit_of_work() as uow:
            states = live_job_states(uow.session, tenant, ["kelp.txt", "coral.txt"])
        return (set(states.values()) == {"indexed"} and len(states) == 2) or None

    wait_for(indexed, 60, what="both documents indexed")
    with unit_of_work() as uow:
        jobs = uow.session.scalars(select(IngestJob).where(IngestJob.tenant_id == tenant)).all()
        letter = uow.session.scalar(select(DeadLetter).where(DeadLetter.tenant_id == tenant))
    assert len(jobs) == 2  # the repeated kelp event was unchanged: no second version or job
    assert len({job.started_at for job in jobs}) == 1  # one claim took both
    assert letter is not None and letter.ref == "bad.bin" and "content_base64" in letter.message
    wait_converged(tenant)
    assert search(client, auth, "calcium carbonate reefs")["results"][0]["text"].startswith(
        "Corals"
    )


def test_events_with_fields_postgres_cannot_store_are_dead_lettered_with_the_reason(
    client: TestClient, auth, tenant, worker
):
    """Refused at the door, each with its reason, in the message's own transaction: the
    events around them are accepted."""
    from shared.queue import publish_upload_events

    good = [
        build_upload_event(tenant_id=tenant, external_id=f"{name}.txt", raw=text.encode())
        for name, text in [("tide", "Tides follow the moon."), ("reef", "Reefs shelter fish.")]
    ]
    bad: dict[str, tuple[dict[str, Any], str]] = {
        "nul.txt": ({"metadata": {"note": "a\x00b"}}, "NUL"),
        "nan.txt": ({"metadata": {"score": float("nan")}}, "NaN"),
        "surrogate.txt": ({"metadata": {"note": "a\ud800b"}}, "lone surrogate"),
        "long-title.txt": ({"title": "t" * 1001}, "title is 1001 characters"),
        "number-title.txt": ({"title": 7}, "'title' must be a string"),
    }
    events = [
        {**build_upload_event(tenant_id=tenant, external_id=name, raw=b"fine text"), **fields}
        for name, (fields, _) in bad.items()
    ]
    publish_upload_events([good[0], *events, good[1]])

    def letters() -> dict[str, DeadLetter] | None:
        with unit_of_work() as uow:
            found = uow.session.scalars(
                select(DeadLetter).where(DeadLetter.tenant_id == tenant)
            ).all()
        return {letter.ref: letter for letter in found} if len(found) == len(bad) else None

    found = wait_for(letters, 60, what="a dead letter for each refused event")
    for name, (_, reason) in bad.items():
        assert found[name].stage == "intake" and reason in found[name].message, name
    # Recorded although Postgres could not store them as they came.
    assert found["nul.txt"].payload["metadata"] == {"note": "a b"}
    assert found["surrogate.txt"].payload["metadata"] == {"note": "a\ufffdb"}
    assert found["nan.txt"].payload["metadata"] == {"score": "nan"}
    wait_for(lambda: len(pg_chunks(tenant)) == 2 or None, 60, what="both good documents")
    assert len(wait_converged(tenant)) == 2
    assert search(client, auth, "moon tides")["results"][0]["text"] == "Tides follow the moon."


def test_an_event_the_database_refuses_is_dead_lettered_and_its_neighbours_accepted(
    tenant, worker, monkeypatch
):
    """Should an event the door lets through fail in Postgres, the message's transaction
    fails, so its events are accepted one at a time: the others go through, the bad one
    becomes a dead letter. (The door's check is switched off to let a NUL through; the task
    runs in this process.)"""
    from shared.documents import events as upload_event
    from workers.tasks import accept_upload_events

    monkeypatch.setattr(upload_event, "check_upload", lambda *args: None)
    good = [
        build_upload_event(tenant_id=tenant, external_id=f"{name}.txt", raw=text.encode())
        for name, text in [("tide", "Tides follow the moon."), ("reef", "Reefs shelter fish.")]
    ]
    bad = build_upload_event(
        tenant_id=tenant, external_id="nul.txt", raw=b"fine text", metadata={"note": "a\x00b"}
    )
    result = accept_upload_events.apply(args=[[good[0], bad, good[1]]]).get()
    assert result == {"accepted": 2, "unchanged": 0, "rejected": 1, "deleted": 0}
    with unit_of_work() as uow:
        letter = uow.session.scalar(select(DeadLetter).where(DeadLetter.tenant_id == tenant))
    assert letter is not None and letter.ref == "nul.txt"
    assert "unicode" in letter.message.lower() and "[SQL:" not in letter.message
    assert letter.payload["metadata"] == {"note": "a b"}
    wait_for(lambda: len(pg_chunks(tenant)) == 2 or None, 60, what="both good documents")
    assert len(wait_converged(tenant)) == 2


def test_two_versions_of_one_document_in_one_message_end_at_the_second(
    client: TestClient, auth, tenant, worker
):
    from shared.queue import publish_upload_events

    publish_upload_events(
        [
            build_upload_event(tenant_id=tenant, external_id="log.txt", raw=text.encode())
            for text in ("The ship left port at dawn.", "The ship reached the island at dusk.")
        ]
    )

    def indexed() -> str | None:
        with unit_of_work() as uow:
            states = live_job_states(uow.session, tenant, ["log.txt"])
        return states.get("log.txt") if states.get("log.txt") == "indexed" else None

    wait_for(indexed, 60, what="the document's live version indexed")
    assert set(wait_converged(tenant).values()) == {2}  # version 1's chunks are gone
    found = search(client, auth, "ship island")["results"]
    assert [r["text"] for r in found] == ["The ship reached the island at dusk."]
    document_id = found[0]["document_id"]
    versions = client.get(f"/v1/documents/{document_id}", headers=auth).json()["versions"]
    assert [v["version"] for v in versions] == [1, 2]


def test_chunk_context_is_what_gets_embedded_and_reembed_applies_it(
    client: TestClient, auth, tenant, worker, monkeypatch
):
    """With CONCORD_CHUNK_CONTEXT=title a chunk is embedded after its document's title (its
    stored text unchanged); ``concord reembed`` runs the tenant's documents again, and going
    back to "none" takes every vector from the embedding cache."""
    import numpy as np

    from shared.ingest.embedding import get_embedder
    from shared.jobs import service as job_service
    from shared.stores.vector_store import PgVectorStore

    up = upload_text(client, auth, "quokka", "It smiles at every visitor.", title="Quokka facts")
    wait_job(client, auth, up["job_id"])

    def stored() -> tuple[str, np.ndarray]:
        with unit_of_work() as uow:
            store = PgVectorStore(uow.session)
            (cid,) = pg_chunks(tenant)
            return store.chunks_by_ids([cid])[cid].text, store.embeddings(tenant, [cid])[cid]

    text, plain = stored()
    embedder = get_embedder()

    def reembed_in_process(context: str) -> dict[str, Any]:
        monkeypatch.setattr(get_settings(), "chunk_context", context)
        with paused(worker):  # this process runs the jobs, with this setting
            job_ids = job_service.reprocess_tenant(unit_of_work, tenant, get_settings())
            assert len(job_ids) == 1
            outcome = pipeline.process_job(unit_of_work, job_ids[0]).as_dict()
        return outcome

    titled = reembed_in_process("title")
    assert titled["state"] == "indexed" and titled["cache_hits"] == 0
    text_after, with_title = stored()
    assert text_after == text == "It smiles at every visitor."  # the stored text is the chunk's
    expected = embedder.embed_passages(["Quokka facts\n\nIt smiles at every visitor."])[0]
    assert float(with_title @ expected) > 0.999 and float(with_title @ plain) < 0.99

    back = reembed_in_process("none")
    assert back["cache_hits"] == 1  # the chunk alone was embedded before
    assert float(stored()[1] @ plain) > 0.9999
    wait_converged(tenant)


def test_a_reembed_into_fewer_chunks_removes_the_extra_ones_from_both_stores(
    client: TestClient, auth, tenant, worker, monkeypatch
):
    """The same version chunked again into fewer chunks (a bigger chunk budget here): the
    chunks past the new count leave Postgres and Elasticsearch; none is served stale."""
    from shared.jobs import service as job_service

    text = " ".join(f"Sentence {i} says something about tides and the moon." for i in range(40))
    up = upload_text(client, auth, "tides", text)
    wait_job(client, auth, up["job_id"])
    before = wait_converged(tenant)
    assert len(before) > 2
    monkeypatch.setattr(get_settings(), "chunk_max_tokens", 2000)
    monkeypatch.setattr(get_settings(), "chunk_overlap_tokens", 0)
    with paused(worker):  # this process runs the job, with the bigger budget
        (job_id,) = job_service.reprocess_tenant(unit_of_work, tenant, get_settings())
        assert pipeline.process_job(unit_of_work, job_id).as_dict()["chunks"] == 1
    after = wait_converged(tenant)
    assert len(after) == 1 and set(after) < set(before)
    assert set(es_chunks(tenant)) == set(after)


def test_a_reembed_queues_a_tenant_a_page_at_a_time_and_every_document_comes_back(
    client: TestClient, auth, tenant, worker, monkeypatch
):
    """`concord reembed` locks and queues a page of jobs per transaction (not the tenant's
    whole corpus in one), publishes them in batches, skips none and repeats none."""
    from shared.jobs import service as job_service

    ups = [
        upload_text(client, auth, f"page-{i}", f"Page {i} of the tide tables.") for i in range(5)
    ]
    for up in ups:
        wait_job(client, auth, up["job_id"])
    published: list[list[uuid.UUID]] = []
    real_publish = job_service.publish_ingest_jobs
    monkeypatch.setattr(
        job_service,
        "publish_ingest_jobs",
        lambda ids: published.append(list(ids)) or real_publish(ids),
    )
    job_ids = job_service.reprocess_tenant(unit_of_work, tenant, get_settings(), page=2)
    assert sorted(map(str, job_ids)) == sorted(up["job_id"] for up in ups)
    assert [len(batch) for batch in published] == [2, 2, 1]  # one batch per page here
    for up in ups:
        assert wait_job(client, auth, up["job_id"])["state"] == "indexed"
    assert len(wait_converged(tenant)) == 5


def test_relay_requests_wait_one_at_a_time_and_the_last_commit_of_a_burst_is_not_left_for_beat(
    monkeypatch: Any,
) -> None:
    """A commit asks for a drain unless one is asked for and has not started (that one
    claims the commit's rows too); once a drain starts, the next commit asks again at once.
    The last of several quick commits is therefore never left for beat, as it was while a
    request a second was sent at most (bench/freshness.py: p95 from indexed to searchable
    1.70 s before, 1.03 s after). Each run gets a key of its own: the suite's worker clears
    the real one whenever its drains start."""
    from shared import queue

    key, task = f"test:relay-pending-{uuid.uuid4().hex[:8]}", "concord.test.drain"
    sent: list[str] = []

    def send(name: str, args: list[Any], queue_name: str) -> bool:
        sent.append(name)
        return True

    monkeypatch.setattr(queue, "_send", send)
    assert queue._publish_debounced(key, task, queue.RELAY_QUEUE) and queue._publish_debounced(
        key, task, queue.RELAY_QUEUE
    )
    assert sent == [task]  # the second commit's rows are the waiting drain's
    time.sleep(1.2)  # longer than the old once-a-second window: still waiting, still one
    assert queue._publish_debounced(key, task, queue.RELAY_QUEUE)
    assert sent == [task]
    queue._request_taken(key)  # the drain starts
    assert queue._publish_debounced(key, task, queue.RELAY_QUEUE)
    assert sent == [task, task]  # a commit after its start asks for the next one at once
    assert 0 < queue._redis().ttl(key) <= queue.PENDING_REQUEST_TTL_S  # a lost one expires

    monkeypatch.setattr(queue, "_send", lambda *_: False)
    queue._request_taken(key)
    assert not queue._publish_debounced(key, task, queue.RELAY_QUEUE)
    assert not queue._redis().exists(key)  # nothing waits: the next commit asks again


def test_a_document_of_too_many_chunks_fails_alone_and_its_batch_mates_are_indexed(
    client: TestClient, auth, tenant, worker
):
    """One batch: a markdown file of more sections than a document may make chunks, 4 KB of
    nested tables (which once parsed into 600 KB of text), and another tenant's ordinary
    upload. The first fails with the reason before anything is embedded; the others are
    indexed, the tables as the one line of text they hold."""
    other = f"{tenant}-b"
    other_auth = key_headers(other, ["read", "write"])
    many = "".join(f"# Heading {i}\nWords of section {i}.\n" for i in range(30)).encode()
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
        outcomes = pipeline.process_jobs(unit_of_work, list(jobs.values()), settings)
    states = {name: outcomes[job].state for name, job in jobs.items()}
    assert states == {"many": "failed", "tables": "indexed", "fine": "indexed"}
    failed = wait_job(client, auth, str(jobs["many"]), state="failed")
    assert failed["error"]["stage"] == "chunk" and "the limit is 20" in failed["error"]["message"]
    assert outcomes[jobs["tables"]].detail["chunks"] == 1
    wait_converged(tenant)
    assert len(wait_converged(other)) == 1
