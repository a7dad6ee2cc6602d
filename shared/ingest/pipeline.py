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
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from shared.db import now as db_now
from shared.db import unit_of_work
from shared.errors import ParseError
from shared.ingest import repository as repo
from shared.ingest.chunking import Chunker, TextChunk
from shared.ingest.embedding import Embedder, get_embedder
from shared.ingest.heartbeat import LeaseHeartbeat
from shared.ingest.parsing import ParsedDocument, parse
from shared.logs import job_context
from shared.models import Document, DocumentVersion, IngestJob, JobState, OutboxOp
from shared.queue import publish_ingest_job, publish_relay
from shared.retry import describe_error, is_retriable
from shared.settings import Settings, get_settings
from shared.timing import StageTimes

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
    parsed: ParsedDocument | None = None
    pieces: list[TextChunk] = field(default_factory=list)
    hashes: list[str] = field(default_factory=list)
    vectors: list[np.ndarray] = field(default_factory=list)
    cache_hits: int = 0


def _chunker(settings: Settings, embedder: Embedder) -> Chunker:
    tokenizer = embedder.model().tokenizer

    def offsets(text: str) -> list[tuple[int, int]]:
        encoded = tokenizer(
            text, add_special_tokens=False, return_offsets_mapping=True, verbose=False
        )
        return list(encoded["offset_mapping"])

    return Chunker(
        offsets, settings.chunk_max_tokens, settings.chunk_overlap_tokens, settings.chunk_max_chars
    )


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
        now = db_now(session)
        versions = repo.versions_of_jobs(session, jobs)
        claims = [_start(job, versions, now, settings) for job in jobs]
    return _process([c for c in claims if c is not None], settings, keep=None)


def _process(
    claims: list[_Claim], settings: Settings, keep: uuid.UUID | None
) -> dict[uuid.UUID, JobOutcome]:
    """Parse, chunk, embed and write claimed jobs, each job's failure its own.

    A batch holds jobs of many tenants, so an error that belongs to one job (its content, a
    library's exception on it, a row Postgres refuses) fails that job alone, with its stage,
    class and message, and its batch-mates go on. An error a retry may fix (a store out of
    reach) or one outside any job releases every unfinished job to the queue at once rather
    than leaving them to their leases; ``keep`` (the task's own job) is retried by its task
    instead of being published again."""
    outcomes: dict[uuid.UUID, JobOutcome] = {}
    with LeaseHeartbeat([c.job_id for c in claims], settings):
        try:
            embedder = get_embedder()
            chunker = _chunker(settings, embedder)
            ready = _each_alone(claims, "parse", lambda c: _parse(c, settings), outcomes)
            ready = _each_alone(ready, "chunk", lambda c: _chunk(c, chunker), outcomes)
            ready = _together(
                ready,
                "embed",
                lambda g: _embed(g, embedder, settings.embed_commit_chunks),
                outcomes,
            )
            _together(ready, "write", lambda g: outcomes.update(_write_all(g)), outcomes)
        except Exception:
            unfinished = [c.job_id for c in claims if c.job_id not in outcomes]
            _release(unfinished, settings, retried_by_task=keep)
            raise
    return outcomes


def _each_alone(
    claims: list[_Claim],
    stage: str,
    step: Callable[[_Claim], object],
    outcomes: dict[uuid.UUID, JobOutcome],
) -> list[_Claim]:
    """Run ``step`` on each claim; those it fails for are recorded and left out."""
    done = []
    for claim in claims:
        try:
            step(claim)
        except Exception as e:
            outcomes[claim.job_id] = _job_failed(claim, stage, e)
            continue
        done.append(claim)
    return done


def _together(
    claims: list[_Claim],
    stage: str,
    step: Callable[[list[_Claim]], object],
    outcomes: dict[uuid.UUID, JobOutcome],
) -> list[_Claim]:
    """Run ``step`` on the claims as one batch (one encoder call, one transaction); if that
    fails for a reason a retry will not fix, run it on each claim alone, so that the error
    is charged to the job that caused it and every other job still gets through."""
    if not claims:
        return []
    try:
        step(claims)
        return claims
    except Exception as e:
        if is_retriable(e):
            raise
        if len(claims) == 1:
            outcomes[claims[0].job_id] = _job_failed(claims[0], stage, e)
            return []
        log.warning(
            "%s of a batch of %d jobs failed (%s); one job at a time",
            stage, len(claims), describe_error(e),
        )  # fmt: skip
    return _each_alone(claims, stage, lambda c: step([c]), outcomes)


def _job_failed(claim: _Claim, stage: str, error: Exception) -> JobOutcome:
    """Record that ``claim``'s job failed at ``stage``. Content the parser refuses is the
    upload's own fault (``failed``, with the reason); any other error is dead-lettered, where
    an operator can replay it once its cause is fixed. Errors a retry may fix are not a
    job's own: they propagate and release the whole batch."""
    if is_retriable(error):
        raise error
    dead_letter = not isinstance(error, ParseError)
    with job_context(str(claim.job_id), claim.request_id):
        log.warning("job failed at %s: %s", stage, describe_error(error), exc_info=dead_letter)
    _fail(claim.job_id, stage, error, dead_letter=dead_letter)
    state = JobState.DEAD_LETTERED if dead_letter else JobState.FAILED
    return JobOutcome(str(claim.job_id), state, {"error": describe_error(error), "stage": stage})


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
        now = db_now(session)
        if job.state == JobState.RUNNING and job.lease_expires_at and job.lease_expires_at > now:
            return JobOutcome(str(job_id), job.state, {"leased_elsewhere": True})
        versions = repo.versions_of_jobs(session, [job])
        own = versions.get((job.document_id, job.version))
        room = settings.ingest_batch_bytes - (len(own.raw or b"") if own else 0)
        others = repo.claim_queued_jobs(session, settings.ingest_batch_jobs - 1, job.id, room)
        versions.update(repo.versions_of_jobs(session, others))
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


def _parse(claim: _Claim, settings: Settings) -> None:
    with StageTimes(claim.timings).stage("parse"):
        claim.parsed = parse(claim.raw, claim.content_type, settings.json_text_fields)


def _chunk(claim: _Claim, chunker: Chunker) -> None:
    assert claim.parsed is not None
    with StageTimes(claim.timings).stage("chunk"):
        claim.pieces = chunker.chunk(claim.parsed)
        claim.hashes = [text_hash(p.text) for p in claim.pieces]
    claim.parsed = None  # the chunks hold what is needed now


def _embed(claims: list[_Claim], embedder: Embedder, commit_every: int) -> None:
    """Encode every chunk of the batch that this model has never embedded; each job is
    charged its share of the time by chunk count. The vectors are cached as they are made,
    ``commit_every`` chunks at a time, so that an attempt cut short (a time limit, a crash)
    leaves its work for the next one: a document of any size gets through in the end."""
    started = time.perf_counter()
    all_hashes = [h for c in claims for h in c.hashes]
    with unit_of_work() as uow:
        cached = repo.cached_embeddings(uow.session, embedder.model_id, all_hashes)
    pieces = {h: p for c in claims for h, p in zip(c.hashes, c.pieces, strict=True)}
    missing = [h for h in dict.fromkeys(all_hashes) if h not in cached]
    fresh: dict[str, np.ndarray] = {}
    for start in range(0, len(missing), commit_every):
        part = missing[start : start + commit_every]
        vectors = embedder.embed_passages(
            [pieces[h].text for h in part],
            token_counts=[pieces[h].token_count for h in part],  # the chunker counted them
        )
        made = dict(zip(part, vectors, strict=True))
        with unit_of_work() as uow:
            repo.store_embeddings(uow.session, embedder.model_id, made)
        fresh.update(made)
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
        finished_at = db_now(session)
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
                external_id=docs[c.document_id].external_id,
                title=docs[c.document_id].title,
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


def _release(
    job_ids: list[uuid.UUID], settings: Settings, retried_by_task: uuid.UUID | None
) -> None:
    """Hand unfinished jobs back to the queue at once, each with a message of its own, except
    ``retried_by_task``: its task's retry brings it back, and should that message be lost,
    its lease (expired now) lets the next sweep publish it. Best effort: if Postgres is out
    of reach too, the jobs' leases (no longer renewed) run out and the sweep takes them."""
    if not job_ids:
        return
    try:
        with unit_of_work() as uow:
            now = db_now(uow.session)
            for job in repo.lock_jobs(uow.session, job_ids).values():
                if job.state != JobState.RUNNING:
                    continue
                job.state = JobState.QUEUED
                if job.id == retried_by_task:
                    job.lease_expires_at = now
                else:
                    repo.extend_lease(job, now, settings.queued_republish_seconds)
                    uow.after_commit(functools.partial(publish_ingest_job, job.id))
    except Exception as e:
        log.warning("could not release %d jobs (%s); their leases will run out", len(job_ids), e)


def _fail(job_id: uuid.UUID, stage: str, error: Exception, dead_letter: bool) -> None:
    with unit_of_work() as uow:
        job = repo.lock_job(uow.session, job_id)
        if job is None or job.state in (JobState.INDEXED, JobState.DEAD_LETTERED):
            return  # finished meanwhile, by a worker that took it over
        job.state = JobState.DEAD_LETTERED if dead_letter else JobState.FAILED
        job.error_stage = stage
        job.error_class = type(error).__name__
        job.error_message = describe_error(error)
        job.finished_at = db_now(uow.session)
        job.lease_expires_at = None
        if dead_letter:
            repo.add_dead_letter(
                uow.session,
                tenant_id=job.tenant_id,
                source="job",
                ref=str(job.id),
                stage=stage,
                error_class=type(error).__name__,
                message=job.error_message,
                attempts=job.attempts,
                payload={"document_id": str(job.document_id), "version": job.version},
            )


def record_failure(job_id: uuid.UUID, error: Exception) -> None:
    """Used by the task when its retries are spent or its error is not one a retry fixes:
    the job is dead-lettered with the error, where an operator can see and replay it."""
    _fail(job_id, "process", error, dead_letter=True)
