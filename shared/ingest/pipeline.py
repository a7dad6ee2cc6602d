"""Process ingest jobs: claim their leases, parse, chunk, embed, then write the versions'
chunks, embeddings and outbox rows in one Postgres transaction per batch.

A task delivers one job id, but the worker also claims up to ``ingest_batch_jobs - 1`` other
queued jobs and embeds all their chunks together, so a busy queue is processed in batches
(fewer transactions and tasks, fuller encoder batches). The claimed jobs' own messages arrive
later and find them finished or still running in that batch: a duplicate delivery, a no-op.

Every step is safe to run twice: chunk ids are deterministic, writes are version-guarded, and a
job whose document has moved on to a newer version finishes without writing anything.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from shared.db import unit_of_work
from shared.errors import ParseError
from shared.ingest import repository as repo
from shared.ingest.chunking import Chunker, TextChunk
from shared.ingest.embedding import Embedder, get_embedder
from shared.ingest.parsing import parse
from shared.logs import job_context
from shared.models import Document, DocumentVersion, IngestJob, JobState, OutboxOp
from shared.queue import publish_ingest_job, publish_relay
from shared.settings import Settings, get_settings

log = logging.getLogger(__name__)


def chunk_id(document_id: uuid.UUID, ordinal: int) -> str:
    return f"{document_id}:{ordinal}"


def document_of_chunk(chunk_id: str) -> str:
    """The document id a chunk id names (the inverse of :func:`chunk_id`)."""
    return chunk_id.rpartition(":")[0]


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class JobOutcome:
    job_id: str
    state: str
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Claim:
    job_id: uuid.UUID
    tenant_id: str
    document_id: uuid.UUID
    version: int
    raw: bytes
    content_type: str
    request_id: str | None = None  # of the upload that created the job, for the logs
    timings: dict[str, float] = field(default_factory=dict)
    pieces: list[TextChunk] = field(default_factory=list)
    hashes: list[str] = field(default_factory=list)
    vectors: list[np.ndarray] = field(default_factory=list)
    cache_hits: int = 0


@contextmanager
def _timed(timings: dict[str, float], stage: str) -> Iterator[None]:
    started = time.perf_counter()
    try:
        yield
    finally:
        timings[stage] = round(timings.get(stage, 0.0) + time.perf_counter() - started, 4)


def _chunker(settings: Settings, embedder: Embedder) -> Chunker:
    tokenizer = embedder.model().tokenizer

    def offsets(text: str) -> list[tuple[int, int]]:
        encoded = tokenizer(
            text, add_special_tokens=False, return_offsets_mapping=True, verbose=False
        )
        return list(encoded["offset_mapping"])

    return Chunker(offsets, settings.chunk_max_tokens, settings.chunk_overlap_tokens)


def process_job(job_id: uuid.UUID) -> JobOutcome:
    """Process ``job_id`` (and a batch of other queued jobs); returns ``job_id``'s outcome."""
    settings = get_settings()
    claims = _claim(job_id, settings)
    if isinstance(claims, JobOutcome):
        return claims
    # On failure the task retries ``job_id``; its batch-mates go back to the queue.
    return _process(claims, settings, keep=job_id)[job_id]


def process_jobs(job_ids: list[uuid.UUID]) -> dict[uuid.UUID, JobOutcome]:
    """Process the jobs that were accepted together (one message for all of them) as one
    batch; those finished or running elsewhere by now are left alone. On failure every one
    goes back to the queue with a message of its own, where :func:`process_job`'s retries
    and dead-lettering apply."""
    settings = get_settings()
    with unit_of_work() as uow:
        session = uow.session
        jobs = repo.claimable_jobs(session, job_ids)
        now = repo.now(session)
        versions = repo.versions_of_jobs(session, jobs)
        claims = [_start(job, versions, now, settings) for job in jobs]
    return _process([c for c in claims if c is not None], settings, keep=None)


def _process(
    claims: list[_Claim], settings: Settings, keep: uuid.UUID | None
) -> dict[uuid.UUID, JobOutcome]:
    """Parse, chunk, embed and write claimed jobs. If that fails, the claimed jobs that did
    not finish are released to the queue at once (except ``keep``, which its task retries)
    rather than left waiting for their leases to expire."""
    outcomes: dict[uuid.UUID, JobOutcome] = {}
    try:
        chunker = _chunker(settings, get_embedder())
        ready = []
        for claim in claims:
            failed = _parse_and_chunk(claim, chunker, settings)
            if failed:
                outcomes[claim.job_id] = failed
            else:
                ready.append(claim)
        _embed(ready, get_embedder())
        outcomes.update(_write_all(ready))
    except Exception:
        _release([c.job_id for c in claims if c.job_id not in outcomes and c.job_id != keep])
        raise
    return outcomes


def _claim(job_id: uuid.UUID, settings: Settings) -> list[_Claim] | JobOutcome:
    """Take ``job_id``'s lease, plus those of up to ``ingest_batch_jobs - 1`` queued jobs.

    A job already finished, or running under someone else's live lease (a duplicate
    delivery), is left alone."""
    finished = _already_finished(job_id)
    if finished:
        return finished
    with unit_of_work() as uow:
        session = uow.session
        job = repo.lock_job(session, job_id)
        if job is None:
            return JobOutcome(str(job_id), "missing")
        if job.state in (JobState.INDEXED, JobState.FAILED, JobState.DEAD_LETTERED):
            return JobOutcome(str(job_id), job.state, {"duplicate_delivery": True})
        now = repo.now(session)
        if job.state == JobState.RUNNING and job.lease_expires_at and job.lease_expires_at > now:
            return JobOutcome(str(job_id), job.state, {"leased_elsewhere": True})
        others = repo.claim_queued_jobs(session, settings.ingest_batch_jobs - 1, job.id)
        versions = repo.versions_of_jobs(session, [job, *others])
        first = _start(job, versions, now, settings)
        if first is None:  # the batch-mates stay queued, untouched
            return JobOutcome(str(job_id), job.state, {"error": job.error_message})
        rest = [_start(other, versions, now, settings) for other in others]
        return [first, *(c for c in rest if c is not None)]


def _already_finished(job_id: uuid.UUID) -> JobOutcome | None:
    """The common duplicate delivery (a batch-mate's own message: its job finished, or still
    running in that batch) answered by a plain read, without taking a lock or writing."""
    with unit_of_work() as uow:
        found = repo.job_state(uow.session, job_id)
    if found is None:
        return None
    state, lease_live = found
    if state in (JobState.INDEXED, JobState.FAILED, JobState.DEAD_LETTERED):
        return JobOutcome(str(job_id), state, {"duplicate_delivery": True})
    if state == JobState.RUNNING and lease_live:
        return JobOutcome(str(job_id), state, {"leased_elsewhere": True})
    return None


def _start(
    job: IngestJob,
    versions: dict[tuple[uuid.UUID, int], DocumentVersion],
    now: datetime,
    settings: Settings,
) -> _Claim | None:
    version = versions.get((job.document_id, job.version))
    if version is None or version.raw is None:
        job.state = JobState.FAILED
        job.error_stage, job.error_class = "claim", "MissingContent"
        job.error_message = "the document version has no stored content"
        job.finished_at = now
        return None
    job.state = JobState.RUNNING
    job.attempts += 1
    job.started_at = now
    repo.extend_lease(job, now, settings.job_lease_seconds)
    return _Claim(
        job.id,
        job.tenant_id,
        job.document_id,
        job.version,
        version.raw,
        version.content_type,
        request_id=(job.detail or {}).get("request_id"),
    )


def _parse_and_chunk(claim: _Claim, chunker: Chunker, settings: Settings) -> JobOutcome | None:
    try:
        with _timed(claim.timings, "parse"):
            parsed = parse(claim.raw, claim.content_type, settings.json_text_fields)
        with _timed(claim.timings, "chunk"):
            claim.pieces = chunker.chunk(parsed)
    except ParseError as e:
        _fail(claim.job_id, "parse", e, dead_letter=False)
        return JobOutcome(str(claim.job_id), JobState.FAILED, {"error": e.message})
    claim.hashes = [text_hash(p.text) for p in claim.pieces]
    return None


def _embed(claims: list[_Claim], embedder: Embedder) -> None:
    """One encoder call for every chunk of the batch that this model has never embedded; each
    job is charged its share of the time by chunk count."""
    started = time.perf_counter()
    all_hashes = [h for c in claims for h in c.hashes]
    with unit_of_work() as uow:
        cached = repo.cached_embeddings(uow.session, embedder.model_id, all_hashes)
    pieces = {h: p for c in claims for h, p in zip(c.hashes, c.pieces, strict=True)}
    missing = [h for h in dict.fromkeys(all_hashes) if h not in cached]
    fresh: dict[str, np.ndarray] = {}
    if missing:
        vectors = embedder.embed_passages(
            [pieces[h].text for h in missing],
            token_counts=[pieces[h].token_count for h in missing],  # the chunker counted them
        )
        fresh = dict(zip(missing, vectors, strict=True))
        with unit_of_work() as uow:
            repo.store_embeddings(uow.session, embedder.model_id, fresh)
    elapsed = time.perf_counter() - started
    for claim in claims:
        claim.vectors = [cached[h] if h in cached else fresh[h] for h in claim.hashes]
        claim.cache_hits = sum(1 for h in claim.hashes if h in cached)
        share = len(claim.hashes) / max(len(all_hashes), 1)
        claim.timings["embed"] = round(elapsed * share, 4)


def _write_all(claims: list[_Claim]) -> dict[uuid.UUID, JobOutcome]:
    """Write the batch in one transaction with a fixed number of statements whatever its
    size: the documents' locks, the jobs, the documents, the chunks, the superseded chunks
    and the outbox rows each take one round trip."""
    write_started = time.perf_counter()
    with unit_of_work() as uow:
        session = uow.session
        repo.lock_keys(session, [f"document:{c.document_id}" for c in claims])
        jobs = repo.lock_jobs(session, [c.job_id for c in claims])
        docs = repo.documents_by_ids(session, [c.document_id for c in claims])
        finished_at = repo.now(session)
        outcomes: dict[uuid.UUID, JobOutcome] = {}
        finished: list[tuple[IngestJob, _Claim]] = []
        writes: dict[uuid.UUID, _Claim] = {}  # document id -> the one claim writing it
        for claim in claims:
            job = jobs.get(claim.job_id)
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
                writes.setdefault(claim.document_id, claim)
                detail = {
                    "chunks": len(claim.pieces),
                    "cache_hits": claim.cache_hits,
                    "embedded": len(claim.pieces) - claim.cache_hits,
                }
            outcomes[claim.job_id] = _finish(job, claim, detail, finished_at)
            finished.append((job, claim))
        _write_versions(session, list(writes.values()), docs)
        if writes:
            uow.after_commit(publish_relay)  # debounced: one request per second at most
        # Each job is charged its share of the batch's write time by chunk count.
        write_s = time.perf_counter() - write_started
        chunks = max(sum(len(claim.pieces) for _, claim in finished), 1)
        for job, claim in finished:
            write_share = round(write_s * len(claim.pieces) / chunks, 4)
            job.stage_timings = {**claim.timings, "write": write_share}
    for job, claim in finished:
        with job_context(str(claim.job_id), claim.request_id):
            log.info(
                "job indexed: document %s version %s, %s chunks, stages %s",
                claim.document_id, claim.version, len(claim.pieces), job.stage_timings,
            )  # fmt: skip
    return outcomes


def _write_versions(
    session: Session, claims: list[_Claim], docs: dict[uuid.UUID, Document]
) -> None:
    """The chunks and embeddings of each claimed live version, the removal of the chunks
    they supersede, and the outbox rows that carry both to Elasticsearch."""
    repo.upsert_chunks(
        session,
        [
            repo.VersionChunks(
                tenant_id=c.tenant_id,
                document_id=c.document_id,
                version=c.version,
                metadata=docs[c.document_id].metadata_ or {},
                rows=_chunk_rows(c),
            )
            for c in claims
        ],
    )
    removed = repo.delete_superseded_chunks(session, {c.document_id: c.version for c in claims})
    entries = []
    for c in claims:
        live_ids = sorted(chunk_id(c.document_id, p.ordinal) for p in c.pieces)
        live = set(live_ids)
        gone = [i for i in removed.get(c.document_id, []) if i not in live]
        entries += [
            repo.OutboxEntry(c.tenant_id, c.document_id, OutboxOp.INDEX, c.version, live_ids),
            repo.OutboxEntry(c.tenant_id, c.document_id, OutboxOp.DELETE, c.version, gone),
        ]
    repo.add_outbox_entries(session, entries)


def _chunk_rows(claim: _Claim) -> list[repo.ChunkRow]:
    return [
        repo.ChunkRow(
            id=chunk_id(claim.document_id, p.ordinal),
            ordinal=p.ordinal,
            text=p.text,
            text_hash=h,
            char_start=p.char_start,
            char_end=p.char_end,
            section=p.section,
            token_count=p.token_count,
            embedding=v,
        )
        for p, h, v in zip(claim.pieces, claim.hashes, claim.vectors, strict=True)
    ]


def _finish(
    job: IngestJob, claim: _Claim, detail: dict[str, Any], finished_at: datetime
) -> JobOutcome:
    job.state = JobState.INDEXED
    job.finished_at = finished_at
    job.lease_expires_at = None
    job.error_stage = job.error_class = job.error_message = None
    if claim.request_id:
        detail["request_id"] = claim.request_id
    job.detail = detail
    return JobOutcome(str(claim.job_id), JobState.INDEXED, detail)


def _release(job_ids: list[uuid.UUID]) -> None:
    """Hand unfinished batch-mates back to the queue at once."""
    if not job_ids:
        return
    with unit_of_work() as uow:
        for job_id in job_ids:
            job = repo.lock_job(uow.session, job_id)
            if job is not None and job.state == JobState.RUNNING:
                job.state = JobState.QUEUED
                job.lease_expires_at = repo.now(uow.session)
                uow.after_commit(functools.partial(publish_ingest_job, job_id))


def _fail(job_id: uuid.UUID, stage: str, error: Exception, dead_letter: bool) -> None:
    with unit_of_work() as uow:
        job = repo.lock_job(uow.session, job_id)
        if job is None:
            return
        job.state = JobState.DEAD_LETTERED if dead_letter else JobState.FAILED
        job.error_stage = stage
        job.error_class = type(error).__name__
        job.error_message = str(error)[:4000]
        job.finished_at = repo.now(uow.session)
        job.lease_expires_at = None
        if dead_letter:
            repo.add_dead_letter(
                uow.session,
                tenant_id=job.tenant_id,
                source="job",
                ref=str(job.id),
                stage=stage,
                error_class=type(error).__name__,
                message=str(error),
                attempts=job.attempts,
                payload={"document_id": str(job.document_id), "version": job.version},
            )


def record_failure(job_id: uuid.UUID, error: Exception, dead_letter: bool) -> None:
    """Used by the task wrapper when retries are exhausted or the error is not retriable."""
    _fail(job_id, "process", error, dead_letter=dead_letter)
