"""The write step: a batch of encoded documents, their jobs finished and their chunks written
to Postgres/pgvector in the caller's transaction, with the outbox rows that carry them to
Elasticsearch. A job whose document has moved on (a newer version, a delete) finishes
without writing anything: it would resurrect stale text."""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from shared.db import UnitOfWork
from shared.db.repository import lock_keys, now
from shared.documents import repository as documents_repo
from shared.ingest.values import Encoded, JobOutcome
from shared.jobs import repository as jobs_repo
from shared.jobs import service as jobs
from shared.logs import job_context
from shared.models import Document, IngestJob, JobState, OutboxOp
from shared.outbox import repository as outbox_repo
from shared.queue import TaskQueue
from shared.settings import get_settings
from shared.stores.ports import VectorWriter
from shared.stores.schemas import ChunkRow, VersionChunks, chunk_id
from shared.webhooks import service as webhooks

log = logging.getLogger(__name__)


def write_batch(
    uow: UnitOfWork, batch: list[Encoded], vectors: VectorWriter, queue: TaskQueue
) -> dict[uuid.UUID, JobOutcome]:
    """Write the batch in the caller's transaction with a fixed number of statements whatever
    its size: the documents' locks, the jobs, the documents, the chunks, the superseded chunks
    and the outbox rows each take one round trip."""
    write_started = time.perf_counter()
    session = uow.session
    claims = [e.claim for e in batch]
    lock_keys(session, [f"document:{c.document_id}" for c in claims])
    locked = jobs_repo.lock_jobs(session, [c.job_id for c in claims])
    docs = documents_repo.documents_by_ids(session, [c.document_id for c in claims])
    finished_at = now(session)
    outcomes: dict[uuid.UUID, JobOutcome] = {}
    finished: list[tuple[IngestJob, Encoded]] = []
    writes: dict[uuid.UUID, Encoded] = {}  # document id -> the one job writing it
    for encoded in batch:
        claim = encoded.claim
        job = locked.get(claim.job_id)
        if job is None or job.state != JobState.RUNNING:
            state = job.state if job else "missing"
            outcomes[claim.job_id] = JobOutcome(str(claim.job_id), state)
            continue
        doc = docs.get(claim.document_id)
        if doc is not None and doc.tenant_id != claim.tenant_id:
            doc = None  # never another tenant's row
        if doc is None or doc.deleted or doc.version != claim.version:
            # A newer version or a delete won: writing this one would resurrect stale text.
            detail: dict[str, Any] = {"superseded_by": doc.version if doc else None}
        else:
            # One job per version, so one writer per document; setdefault keeps it so
            # (Postgres refuses to update one row twice in a statement).
            writes.setdefault(claim.document_id, encoded)
            detail = _indexed_detail(encoded)
        if claim.request_id:
            detail["request_id"] = claim.request_id
        jobs.finish(job, detail, finished_at)
        outcomes[claim.job_id] = JobOutcome(str(claim.job_id), JobState.INDEXED, detail)
        finished.append((job, encoded))
    _write_versions(uow, list(writes.values()), docs, vectors, queue)
    webhooks.job_finished(uow, [job for job, _ in finished], queue=queue)  # one statement
    _record_timings(finished, time.perf_counter() - write_started)
    return outcomes


def _indexed_detail(encoded: Encoded) -> dict[str, Any]:
    chunks = len(encoded.chunked.pieces)
    detail: dict[str, Any] = {
        "chunks": chunks,
        "cache_hits": encoded.cache_hits,
        "embedded": chunks - encoded.cache_hits,
    }
    if encoded.chunked.parse_notes:
        detail["parse_notes"] = list(encoded.chunked.parse_notes)
    return detail


def _record_timings(finished: list[tuple[IngestJob, Encoded]], write_s: float) -> None:
    """Each job's stage timings, charged its share of the batch's write time by chunk count."""
    chunks = max(sum(len(e.chunked.pieces) for _, e in finished), 1)
    for job, encoded in finished:
        pieces = len(encoded.chunked.pieces)
        job.stage_timings = {**encoded.timings, "write": round(write_s * pieces / chunks, 4)}
        claim = encoded.claim
        with job_context(str(claim.job_id), claim.request_id):
            log.info(
                "job indexed: document %s version %s, %s chunks, stages %s",
                claim.document_id, claim.version, pieces, job.stage_timings,
            )  # fmt: skip


def _write_versions(
    uow: UnitOfWork,
    batch: list[Encoded],
    docs: dict[uuid.UUID, Document],
    store: VectorWriter,
    queue: TaskQueue,
) -> None:
    """The chunks and embeddings of each claimed live version, the removal of the chunks
    they supersede, and the outbox rows that carry both to Elasticsearch; the relay is
    nudged once they are committed."""
    if not batch:
        return
    store.upsert(
        [
            VersionChunks(
                tenant_id=e.claim.tenant_id,
                document_id=e.claim.document_id,
                version=e.claim.version,
                external_id=docs[e.claim.document_id].external_id,
                title=docs[e.claim.document_id].title,
                metadata=docs[e.claim.document_id].metadata_ or {},
                rows=_chunk_rows(e),
            )
            for e in batch
        ]
    )
    claims = [e.claim for e in batch]
    pieces = {e.claim.document_id: e.chunked.pieces for e in batch}
    # The counts remove a version's own chunks past its new count: a version chunked again
    # (concord reembed after a chunking change) may have fewer chunks than before.
    removed = store.delete_superseded(
        {c.document_id: c.version for c in claims},
        {c.document_id: len(pieces[c.document_id]) for c in claims},
    )
    entries = []
    for c in claims:
        live_ids = sorted(chunk_id(c.document_id, p.ordinal) for p in pieces[c.document_id])
        live = set(live_ids)
        gone = [i for i in removed.get(c.document_id, []) if i not in live]
        entries += [
            outbox_repo.OutboxEntry(
                c.tenant_id, c.document_id, OutboxOp.INDEX, c.version, live_ids
            ),
            # A purge (it removes copies up to this version, this one included): a chunk this
            # version had before it was chunked again into fewer has a copy at this very
            # version, which a delete (strictly newer only) would leave. No copy of a gone id
            # is written at this version any more, and a later version's write wins over it.
            outbox_repo.OutboxEntry(c.tenant_id, c.document_id, OutboxOp.PURGE, c.version, gone),
        ]
    outbox_repo.add_outbox_entries(uow.session, entries)
    uow.after_commit(queue.publish_relay)  # debounced: one waiting request at most
    if get_settings().calibrate_after_ingest:
        # A tenant whose last job this was is calibrated once it has settled (calibration.py)
        uow.after_commit(queue.publish_calibration)


def _chunk_rows(encoded: Encoded) -> list[ChunkRow]:
    chunked, document_id = encoded.chunked, encoded.claim.document_id
    return [
        ChunkRow(
            id=chunk_id(document_id, p.ordinal),
            ordinal=p.ordinal,
            text=p.text,
            text_hash=h,
            char_start=p.char_start,
            char_end=p.char_end,
            section=p.section,
            token_count=p.token_count,
            embedding=v,
            flags=list(p.flags),
            first_sentence_tokens=p.first_sentence_tokens,
        )
        for p, h, v in zip(chunked.pieces, chunked.hashes, encoded.vectors, strict=True)
    ]
