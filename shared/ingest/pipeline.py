"""Process one ingest job: claim its lease, parse, chunk, embed, then write the version's
chunks, embeddings and outbox rows in one Postgres transaction.

Every step is safe to run twice: chunk ids are deterministic, writes are version-guarded, and
a job whose document has moved on to a newer version finishes without writing anything.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from shared.db import unit_of_work
from shared.errors import ParseError
from shared.ingest import repository as repo
from shared.ingest.chunking import Chunker
from shared.ingest.embedding import Embedder, get_embedder
from shared.ingest.parsing import parse
from shared.models import JobState, OutboxOp
from shared.queue import publish_relay
from shared.settings import Settings, get_settings

log = logging.getLogger(__name__)


def chunk_id(document_id: uuid.UUID, ordinal: int) -> str:
    return f"{document_id}:{ordinal}"


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class JobOutcome:
    job_id: str
    state: str
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Claim:
    tenant_id: str
    document_id: uuid.UUID
    version: int
    raw: bytes
    content_type: str
    attempts: int


class StageTimer:
    def __init__(self) -> None:
        self.timings: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.timings[name] = round(time.perf_counter() - started, 4)


def _chunker(settings: Settings, embedder: Embedder) -> Chunker:
    tokenizer = embedder.model().tokenizer

    def offsets(text: str) -> list[tuple[int, int]]:
        encoded = tokenizer(
            text, add_special_tokens=False, return_offsets_mapping=True, verbose=False
        )
        return list(encoded["offset_mapping"])

    return Chunker(offsets, settings.chunk_max_tokens, settings.chunk_overlap_tokens)


def process_job(job_id: uuid.UUID) -> JobOutcome:
    settings = get_settings()
    claim = _claim(job_id, settings)
    if isinstance(claim, JobOutcome):
        return claim
    timer = StageTimer()
    embedder = get_embedder()
    try:
        with timer.stage("parse"):
            parsed = parse(claim.raw, claim.content_type, settings.json_text_fields)
        with timer.stage("chunk"):
            pieces = _chunker(settings, embedder).chunk(parsed)
    except ParseError as e:
        _fail(job_id, "parse", e, dead_letter=False)
        return JobOutcome(str(job_id), JobState.FAILED, {"error": e.message})

    with timer.stage("embed"):
        hashes = [text_hash(p.text) for p in pieces]
        vectors, cache_hits = _embed_with_cache(embedder, [p.text for p in pieces], hashes)

    rows = [
        repo.ChunkRow(
            id=chunk_id(claim.document_id, p.ordinal),
            ordinal=p.ordinal,
            text=p.text,
            text_hash=h,
            char_start=p.char_start,
            char_end=p.char_end,
            section=p.section,
            embedding=v,
        )
        for p, h, v in zip(pieces, hashes, vectors, strict=True)
    ]
    write_started = time.perf_counter()
    with unit_of_work() as uow:
        session = uow.session
        repo.lock_key(session, f"document:{claim.document_id}")
        job = repo.lock_job(session, job_id)
        doc = repo.document_for_tenant(session, claim.tenant_id, claim.document_id)
        if job is None or job.state != JobState.RUNNING:
            return JobOutcome(str(job_id), job.state if job else "missing")
        detail: dict[str, Any] = {
            "chunks": len(rows),
            "cache_hits": cache_hits,
            "embedded": len(rows) - cache_hits,
        }
        if doc is None or doc.deleted or doc.version != claim.version:
            # A newer version or a delete won: writing this one would resurrect stale text.
            detail = {"superseded_by": doc.version if doc else None}
        else:
            repo.upsert_chunks(
                session,
                tenant_id=claim.tenant_id,
                document_id=claim.document_id,
                version=claim.version,
                rows=rows,
            )
            removed = repo.delete_chunks_older_than(session, claim.document_id, claim.version)
            live_ids = {r.id for r in rows}
            repo.add_outbox(
                session,
                tenant_id=claim.tenant_id,
                document_id=claim.document_id,
                op=OutboxOp.INDEX,
                version=claim.version,
                chunk_ids=sorted(live_ids),
            )
            repo.add_outbox(
                session,
                tenant_id=claim.tenant_id,
                document_id=claim.document_id,
                op=OutboxOp.DELETE,
                version=claim.version,
                chunk_ids=[c for c in removed if c not in live_ids],
            )
            uow.after_commit(publish_relay)
        job.state = JobState.INDEXED
        job.finished_at = repo.now(session)
        job.lease_expires_at = None
        job.error_stage = job.error_class = job.error_message = None
        job.detail = detail
        job.stage_timings = {
            **timer.timings,
            "write": round(time.perf_counter() - write_started, 4),
        }
    return JobOutcome(str(job_id), JobState.INDEXED, detail)


def _claim(job_id: uuid.UUID, settings: Settings) -> _Claim | JobOutcome:
    """Take the job's lease. A job already finished, or running under someone else's live
    lease (a duplicate delivery), is left alone."""
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
        version = repo.document_version(session, job.document_id, job.version)
        if version is None or version.raw is None:
            job.state = JobState.FAILED
            job.error_stage, job.error_class = "claim", "MissingContent"
            job.error_message = "the document version has no stored content"
            job.finished_at = now
            return JobOutcome(str(job_id), JobState.FAILED)
        job.state = JobState.RUNNING
        job.attempts += 1
        job.started_at = now
        repo.extend_lease(job, now, settings.job_lease_seconds)
        return _Claim(
            job.tenant_id,
            job.document_id,
            job.version,
            version.raw,
            version.content_type,
            job.attempts,
        )


def _embed_with_cache(
    embedder: Embedder, texts: list[str], hashes: list[str]
) -> tuple[list[list[float]], int]:
    """Embed only texts this model has never embedded; returns (vectors, cache hits)."""
    with unit_of_work() as uow:
        cached = repo.cached_embeddings(uow.session, embedder.model_id, hashes)
    missing = {h: t for h, t in zip(hashes, texts, strict=True) if h not in cached}
    fresh: dict[str, list[float]] = {}
    if missing:
        order = list(missing)
        vectors = embedder.embed_passages([missing[h] for h in order])
        fresh = {h: v.tolist() for h, v in zip(order, vectors, strict=True)}
        with unit_of_work() as uow:
            repo.store_embeddings(uow.session, embedder.model_id, fresh)
    vectors_out = [list(cached[h]) if h in cached else fresh[h] for h in hashes]
    hits = sum(1 for h in hashes if h in cached)
    return vectors_out, hits


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
