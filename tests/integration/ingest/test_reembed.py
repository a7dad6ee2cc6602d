"""concord reembed: chunks rewritten at their version with what the settings now say, a page
of jobs at a time, unchanged chunks from the embedding cache."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from shared.db import unit_of_work
from shared.ingest import pipeline
from shared.settings import get_settings
from shared.stores.compose import connect
from tests.helpers import (
    RecordingQueue,
    es_chunks,
    paused,
    pg_chunks,
    suite_queue,
    upload_text,
    wait_converged,
    wait_job,
)


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
            job_ids = job_service.reprocess_tenant(
                unit_of_work, tenant, get_settings(), queue=suite_queue()
            )
            assert len(job_ids) == 1
            outcome = pipeline.process_job(connect(), unit_of_work, job_ids[0]).as_dict()
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
        (job_id,) = job_service.reprocess_tenant(
            unit_of_work, tenant, get_settings(), queue=suite_queue()
        )
        assert pipeline.process_job(connect(), unit_of_work, job_id).as_dict()["chunks"] == 1
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
    queue = RecordingQueue("publish_ingest_jobs")
    job_ids = job_service.reprocess_tenant(
        unit_of_work, tenant, get_settings(), page=2, queue=queue
    )
    published = [list(ids) for (ids,) in queue.calls["publish_ingest_jobs"]]
    assert sorted(map(str, job_ids)) == sorted(up["job_id"] for up in ups)
    assert [len(batch) for batch in published] == [2, 2, 1]  # one batch per page here
    for up in ups:
        assert wait_job(client, auth, up["job_id"])["state"] == "indexed"
    assert len(wait_converged(tenant)) == 5
