"""Put a BEIR corpus into a tenant through the real ingest path, and wait until it is served.

Documents go in as upload events on the ingest queue (the path producers use). On a re-run,
documents whose content is unchanged are not published again, and documents of the tenant that
are no longer wanted (e.g. withheld for the unanswerable variant) are deleted (tombstoned)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from evaluation import repository as repo
from shared.db import unit_of_work
from shared.db.repository import count_rows
from shared.documents.events import EventBatcher, build_upload_event
from shared.documents.schemas import Upload
from shared.documents.service import content_hash, delete_document
from shared.jobs.repository import live_job_states
from shared.models import Chunk
from shared.outbox.repository import outbox_backlog
from shared.stores.compose import connect
from shared.stores.partitions import place_tenants

Progress = Callable[[str, int, int], None]  # (stage, done, total)
FINAL_STATES = {"indexed", "failed", "dead_lettered"}


@dataclass
class SyncResult:
    published: int = 0
    unchanged: int = 0
    deleted: int = 0
    indexed: int = 0
    failed: dict[str, str] | None = None  # external id -> job state, for the ones not indexed
    placement: dict[str, Any] | None = None  # what the partition placement run did afterwards


def upload_of(tenant_id: str, record: dict[str, Any]) -> Upload:
    text = str(record.get("text") or "").strip() or str(record.get("title") or "")
    return Upload(
        tenant_id=tenant_id,
        external_id=record["_id"],
        raw=text.encode(),
        content_type="text/plain",
        title=str(record.get("title") or ""),
        metadata={},
    )


def sync_corpus(
    tenant_id: str, records: Iterable[dict[str, Any]], progress: Progress, timeout_s: float
) -> SyncResult:
    """A BEIR corpus (records of _id, title, text) as the tenant's plain-text documents."""
    return sync_uploads(tenant_id, [upload_of(tenant_id, r) for r in records], progress, timeout_s)


def sync_uploads(
    tenant_id: str, uploads: list[Upload], progress: Progress, timeout_s: float
) -> SyncResult:
    """Make ``uploads`` the tenant's documents: publish the new and changed ones, delete the
    others, and wait until every one is indexed (or has failed) and served by both stores."""
    result, stores = SyncResult(), connect()
    with unit_of_work() as uow:
        existing = repo.live_documents(uow.session, tenant_id)
    wanted = {u.external_id for u in uploads}
    batcher = EventBatcher(stores.queue.publish_upload_events)
    for i, upload in enumerate(uploads, start=1):
        if existing.get(upload.external_id, (None, None))[1] == content_hash(upload):
            result.unchanged += 1
        else:
            result.published += batcher.add(
                build_upload_event(
                    tenant_id=tenant_id,
                    external_id=upload.external_id,
                    raw=upload.raw,
                    content_type=upload.content_type,
                    title=upload.title,
                )
            )
        if i % 200 == 0 or i == len(uploads):
            progress("publish", i, len(uploads))
    result.published += batcher.flush()
    for external_id, (doc_id, _) in existing.items():
        if external_id not in wanted:
            with unit_of_work() as uow:
                vectors = stores.vectors(uow.session)
                delete_document(uow, vectors, tenant_id, doc_id, queue=stores.queue)
            result.deleted += 1
    states = _wait_jobs(tenant_id, sorted(wanted), progress, timeout_s)
    result.indexed = sum(1 for s in states.values() if s == "indexed")
    result.failed = {
        e: states.get(e, "never accepted") for e in wanted if states.get(e) != "indexed"
    }
    wait_elasticsearch(tenant_id, timeout_s)
    # What the beat does within CONCORD_PARTITION_INTERVAL_SECONDS (a large tenant gets its own
    # partition and graph): queries are measured where production serves them, not before.
    result.placement = place_tenants(unit_of_work, wait_s=timeout_s).as_dict()
    return result


def _wait_jobs(
    tenant_id: str, external_ids: list[str], progress: Progress, timeout_s: float
) -> dict[str, str]:
    deadline = time.monotonic() + timeout_s
    while True:
        with unit_of_work() as uow:
            states = live_job_states(uow.session, tenant_id, external_ids)
        done = sum(1 for s in states.values() if s in FINAL_STATES)
        progress("index", done, len(external_ids))
        if done == len(external_ids):
            return states
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(external_ids) - done} documents not indexed in {timeout_s} s")
        time.sleep(1.0)


def wait_elasticsearch(tenant_id: str, timeout_s: float, interval_s: float = 0.5) -> None:
    """Until the relay has drained the tenant's outbox and Elasticsearch holds every chunk."""
    index = connect().index
    deadline = time.monotonic() + timeout_s
    while True:
        with unit_of_work() as uow:
            backlog = outbox_backlog(uow.session, tenant_id)
            chunks = count_rows(uow.session, Chunk, tenant_id)
        index.refresh(tenant_id)
        in_es = index.count_of_tenant(tenant_id)
        if not backlog and in_es == chunks:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"Elasticsearch holds {in_es} of {chunks} chunks; {backlog} outbox rows left"
            )
        time.sleep(interval_s)
