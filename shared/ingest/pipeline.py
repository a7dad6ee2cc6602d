"""The ingest pipeline as named steps: claim → parse → chunk → embed → write.

:func:`process_job` (what the task runs, with the task's ``transactions``) claims in one
transaction, then :func:`run` takes each step in turn and opens every transaction a step
needs with the same ``transactions``: the cache writes of :func:`embed_batch` every
``embed_commit_chunks`` chunks, the transaction of :func:`write_batch` for each group of the
batch, a failure's own record. No step opens a transaction of its own accord.

A task delivers one job id, but the worker also claims up to ``ingest_batch_jobs - 1`` other
queued jobs and embeds all their chunks together, so a busy queue is processed in batches
(fewer transactions and tasks, fuller encoder batches). The claimed jobs' own messages arrive
later and find them finished or still running in that batch: a duplicate delivery, a no-op.

Every step is safe to run twice: chunk ids are deterministic, writes are version-guarded, and a
job whose document has moved on to a newer version finishes without writing anything.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
from billiard.exceptions import SoftTimeLimitExceeded
from sqlalchemy.orm import Session

from shared.db import Transactions, UnitOfWork
from shared.db.repository import lock_keys, now
from shared.documents import repository as documents_repo
from shared.errors import ParseError
from shared.ingest import repository as repo
from shared.ingest.chunking import ChunkContext, Chunker, TextChunk, contextual_text
from shared.ingest.embedding import Embedder, get_embedder
from shared.jobs import repository as jobs_repo
from shared.jobs import service as jobs
from shared.jobs.heartbeat import LeaseHeartbeat
from shared.logs import job_context
from shared.models import Document, DocumentVersion, IngestJob, JobState, OutboxOp
from shared.outbox import repository as outbox_repo
from shared.parsing import ParsedDocument, options_from, parse
from shared.queue import TaskQueue
from shared.retry import describe_error, is_retriable
from shared.settings import Settings, get_settings
from shared.stores.compose import Stores
from shared.stores.ports import VectorWriter
from shared.stores.schemas import ChunkRow, VersionChunks, chunk_id
from shared.timing import StageTimes
from shared.webhooks import service as webhooks

log = logging.getLogger(__name__)


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class JobOutcome:
    job_id: str
    state: str
    detail: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "state": str(self.state), **self.detail}


@dataclass
class Claim:
    job_id: uuid.UUID
    tenant_id: str
    document_id: uuid.UUID
    version: int
    raw: bytes
    content_type: str
    request_id: str | None = None  # of the upload that created the job, for the logs
    # When this claim of the job began (its started_at): which claim of it this one is.
    claimed_at: datetime | None = None
    timings: dict[str, float] = field(default_factory=dict)
    parsed: ParsedDocument | None = None
    pieces: list[TextChunk] = field(default_factory=list)
    # What parsing left unread (pages past OCR's bounds), for the job's detail.
    parse_notes: list[str] = field(default_factory=list)
    hashes: list[str] = field(default_factory=list)
    vectors: list[np.ndarray] = field(default_factory=list)
    cache_hits: int = 0
    # Chunks left to encode after this turn (embed_batch's budget ran out): the job waits
    # for its next turn, its encoded chunks kept in the embedding cache.
    left_to_encode: int = 0

    def drop_content(self) -> None:
        """Let go of what the steps made of the document (a failed job's parsed text may be
        hundreds of megabytes)."""
        self.raw, self.parsed, self.pieces, self.hashes, self.vectors = b"", None, [], [], []


def _chunker(settings: Settings, embedder: Embedder) -> Chunker:
    return Chunker(
        embedder.token_offsets,
        settings.chunk_max_tokens,
        settings.chunk_overlap_tokens,
        settings.chunk_max_chars,
        settings.chunk_min_tokens,
    )


# ------------------------------------------------------------------ the job, step by step


def process_job(
    stores: Stores, transactions: Transactions, job_id: uuid.UUID, settings: Settings | None = None
) -> JobOutcome:
    """``job_id`` (and a batch of other queued jobs): claimed in one transaction, then
    parsed, chunked, embedded and written (:func:`run`); returns ``job_id``'s outcome. On an
    error a retry may fix, the batch-mates go back to the queue and the error propagates:
    the caller (the task) retries ``job_id``; unless ``job_id`` was not in the batch (it
    waits its turn), when the error is not its own."""
    settings = settings or get_settings()
    settle_owed_releases(transactions, settings, queue=stores.queue)
    with transactions() as uow:
        claimed = claim(uow, job_id, settings, queue=stores.queue)
    if isinstance(claimed, JobOutcome):
        return claimed
    # The batch is the next work in fair order: ``job_id`` may not be in it (its message is
    # at the back of the queue again, see claim), and then it simply waits its turn.
    waits = JobOutcome(str(job_id), JobState.QUEUED, {"waits_its_turn": True})
    if any(c.job_id == job_id for c in claimed):
        return run(stores, claimed, transactions, settings, retried_by_task=job_id)[job_id]
    try:
        return run(stores, claimed, transactions, settings).get(job_id, waits)
    except Exception:
        # The batch's own jobs are back in the queue (or owed, see _release); the error is
        # not ``job_id``'s, whose task would otherwise retry it and, its retries spent,
        # dead-letter a job that never ran.
        log.warning("a batch run for job %s's message failed; it waits its turn", job_id,
                    exc_info=True)  # fmt: skip
        return waits


def process_jobs(
    stores: Stores,
    transactions: Transactions,
    job_ids: list[uuid.UUID],
    settings: Settings | None = None,
) -> dict[uuid.UUID, JobOutcome]:
    """Jobs accepted together (one message for all of them): a batch claimed as any other
    is (the first of them, then queued jobs round-robin over tenants, within the batch's
    bounds), and the listed jobs left queued go on in a message of their own, at the back of
    the queue. So a message of thousands of jobs is never one batch that every other
    tenant's upload waits behind. On failure every job of the batch goes back to the queue
    with a message of its own."""
    settings = settings or get_settings()
    settle_owed_releases(transactions, settings, queue=stores.queue)
    with transactions() as uow:
        claims, rest = claim_listed(uow, job_ids, settings, queue=stores.queue)
        if rest:
            uow.after_commit(lambda: stores.queue.publish_ingest_jobs(rest))
    return run(stores, claims, transactions, settings)


# ------------------------------------------------------------------ claim


def claim(
    uow: UnitOfWork, job_id: uuid.UUID, settings: Settings, *, queue: TaskQueue
) -> list[Claim] | JobOutcome:
    """A batch for the message of ``job_id``. The message is a wake-up, not an order: the
    batch is the next work in fair order over tenants (:func:`fair_batch`), ``job_id``
    among the candidates like any other. If it is not taken, its message goes to the back of
    the queue again (after commit), so every queued job keeps a message of its own.

    A job already finished, or running under someone else's live lease (a duplicate
    delivery, most often a batch-mate's own message), is left alone: answered by a plain
    read first, without taking a lock. One that lost its worker too often runs alone."""
    session = uow.session
    finished = _duplicate_delivery(uow, job_id)
    if finished:
        return finished
    job = jobs_repo.lock_job(session, job_id)
    if job is None:
        return JobOutcome(str(job_id), "missing")
    if job.state in jobs.FINISHED:
        return JobOutcome(str(job_id), job.state, {"duplicate_delivery": True})
    current = now(session)
    if job.state == JobState.RUNNING and job.lease_expires_at and job.lease_expires_at > current:
        return JobOutcome(str(job_id), job.state, {"leased_elsewhere": True})
    if jobs.runs_alone(job) or job.state == JobState.RUNNING:  # alone, or a lease run out
        batch = [job]
    else:
        batch = list(fair_batch(uow, settings))
        if job not in batch:
            uow.after_commit(lambda: queue.publish_ingest_job(job_id))
            if not batch:  # nothing else claimable either: this one, then
                batch = [job]
    claims = _start_all(uow, batch, current, settings, queue=queue)
    own = next((c for c in claims if c.job_id == job_id), None)
    if own is None and job in batch:  # its content is gone: failed by _start
        return JobOutcome(str(job_id), job.state, {"error": job.error_message})
    return claims or JobOutcome(str(job_id), job.state, {"waits_its_turn": True})


def claim_listed(
    uow: UnitOfWork, job_ids: list[uuid.UUID], settings: Settings, *, queue: TaskQueue
) -> tuple[list[Claim], list[uuid.UUID]]:
    """A batch for a message of ``job_ids``: the next work in fair order over tenants (its
    jobs among the candidates like any other), and the listed jobs still queued after it,
    for a message of their own. Those finished or running elsewhere by now are left alone,
    and so is one that has lost too many attempts (its own message, the sweep's, runs it
    alone)."""
    session = uow.session
    listed = [job for job in jobs_repo.claimable_jobs(session, job_ids) if not jobs.runs_alone(job)]
    if not listed:
        return [], []
    batch = list(fair_batch(uow, settings))
    claims = _start_all(uow, batch, now(session), settings, queue=queue)
    taken = {job.id for job in batch}
    return claims, [j.id for j in listed if j.id not in taken]


def fair_batch(uow: UnitOfWork, settings: Settings) -> Sequence[IngestJob]:
    """The next batch of queued jobs in fair order over tenants, by bytes (see
    jobs.repository.claim_fair_batch): at most ``ingest_batch_jobs`` of them within
    ``ingest_batch_bytes`` together, a tenant with ``ingest_tenant_running_jobs`` jobs
    running already taken after every other one."""
    return jobs_repo.claim_fair_batch(
        uow.session,
        settings.ingest_batch_jobs,
        settings.ingest_batch_bytes,
        jobs.ISOLATE_AFTER_LOST_ATTEMPTS,
        settings.ingest_tenant_running_jobs,
    )


def _start_all(
    uow: UnitOfWork, batch: Sequence[IngestJob], at: Any, settings: Settings, *, queue: TaskQueue
) -> list[Claim]:
    versions = documents_repo.versions(uow.session, [(j.document_id, j.version) for j in batch])
    claims = [_start(uow, job, versions, at, settings, queue=queue) for job in batch]
    return [c for c in claims if c is not None]


def _duplicate_delivery(uow: UnitOfWork, job_id: uuid.UUID) -> JobOutcome | None:
    found = jobs_repo.job_state(uow.session, job_id)
    if found is None:
        return None
    state, lease_live = found
    if state in jobs.FINISHED:
        return JobOutcome(str(job_id), state, {"duplicate_delivery": True})
    if state == JobState.RUNNING and lease_live:
        return JobOutcome(str(job_id), state, {"leased_elsewhere": True})
    return None


def _start(
    uow: UnitOfWork,
    job: IngestJob,
    versions: dict[tuple[uuid.UUID, int], DocumentVersion],
    at: Any,
    settings: Settings,
    *,
    queue: TaskQueue,
) -> Claim | None:
    version = versions.get((job.document_id, job.version))
    if version is None or version.raw is None:
        jobs.fail_without_content(uow, job, at, queue=queue)
        return None
    jobs.start(job, at, settings)
    return Claim(
        job.id,
        job.tenant_id,
        job.document_id,
        job.version,
        version.raw,
        version.content_type,
        request_id=(job.detail or {}).get("request_id"),
        claimed_at=job.started_at,
    )


# ------------------------------------------------------------------ run the steps


def run(
    stores: Stores,
    claims: list[Claim],
    transactions: Transactions,
    settings: Settings | None = None,
    *,
    retried_by_task: uuid.UUID | None = None,
) -> dict[uuid.UUID, JobOutcome]:
    """parse → chunk → embed → write the claimed jobs, each job's failure its own, under a
    heartbeat that keeps their leases.

    A batch holds jobs of many tenants, so an error that belongs to one job (its content, a
    library's exception on it, a row Postgres refuses) fails that job alone, with its stage,
    class and message, and its batch-mates go on. An error a retry may fix (a store out of
    reach) or one outside any job releases every unfinished job to the queue at once rather
    than leaving them to their leases, and propagates; ``retried_by_task`` (the task's own
    job) is retried by its task instead of being published again."""
    settings = settings or get_settings()
    steps = _Steps(transactions, stores.vectors, stores.queue, {})

    turn_left = settings.ingest_turn_chunks  # chunks the batch may still encode

    def embed(group: list[Claim]) -> None:
        nonlocal turn_left
        turn_left -= embed_batch(
            group,
            embedder,
            transactions,
            min(settings.embed_commit_chunks, settings.ingest_turn_chunks),
            settings.chunk_context,
            turn_chunks=turn_left,
        )

    with LeaseHeartbeat([c.job_id for c in claims], transactions, settings):
        try:
            embedder = get_embedder()
            chunker = _chunker(settings, embedder)
            ready = steps.each_alone(claims, "parse", lambda c: parse_job(c, settings))
            ready = steps.each_alone(
                ready, "chunk", lambda c: chunk_job(c, chunker, settings.max_chunks_per_document)
            )
            for group in write_groups(ready, WRITE_GROUP_CHUNKS):
                if turn_left > 0:
                    group = steps.together(group, "embed", embed)
                else:  # the turn is spent: the rest take their next one
                    for claim in group:
                        claim.left_to_encode = len(claim.pieces)
                group = steps.wait_their_turn(group, settings)
                steps.together(group, "write", steps.write_in_own_transaction)
        except Exception as e:
            unfinished = {c.job_id: c.claimed_at for c in claims if c.job_id not in steps.outcomes}
            # Out of time or of memory: no job's own outcome, and any of them may be the
            # reason.
            lost = isinstance(e, (SoftTimeLimitExceeded, MemoryError))
            _release(transactions, unfinished, settings, retried_by_task, lost, queue=stores.queue)
            raise
    return steps.outcomes


class UnrecordedError(Exception):
    """A job's error whose own message the database refused to record."""


@dataclass
class _Steps:
    """Runs a step over the claims and records the outcome of each job it failed, in a
    transaction of its own."""

    transactions: Transactions
    vectors: Callable[[Session], VectorWriter]  # the vector store in a write's transaction
    queue: TaskQueue
    outcomes: dict[uuid.UUID, JobOutcome]

    def wait_their_turn(self, claims: list[Claim], settings: Settings) -> list[Claim]:
        """The claims whose chunks are all encoded; the others (a large document, more chunks
        than a turn encodes) go back to the queue, their encoded chunks cached, and come back
        in their tenant's next turn: one upload of 10 MiB holds a worker for turns of
        ``ingest_turn_chunks`` chunks, with other tenants' work between them, not for minutes."""
        waiting = [c for c in claims if c.left_to_encode]
        if not waiting:
            return claims
        with self.transactions() as uow:
            jobs.wait_next_turn(uow, [c.job_id for c in waiting], settings, queue=self.queue)
        for claim in waiting:
            self.outcomes[claim.job_id] = JobOutcome(
                str(claim.job_id),
                JobState.QUEUED,
                {"chunks": len(claim.hashes), "left_to_encode": claim.left_to_encode},
            )
            claim.drop_content()
        return [c for c in claims if not c.left_to_encode]

    def each_alone(
        self, claims: list[Claim], stage: str, step: Callable[[Claim], object]
    ) -> list[Claim]:
        """Run ``step`` on each claim; those it fails for are recorded and left out."""
        done = []
        for claim in claims:
            try:
                step(claim)
            except Exception as e:
                claim.drop_content()  # not held while its batch-mates go on
                self.outcomes[claim.job_id] = self._job_failed(claim, stage, e)
                continue
            done.append(claim)
        return done

    def together(
        self, claims: list[Claim], stage: str, step: Callable[[list[Claim]], object]
    ) -> list[Claim]:
        """Run ``step`` on the claims as one batch (one encoder call, one transaction); if
        that fails for a reason a retry will not fix, run it on each claim alone, so that the
        error is charged to the job that caused it and every other job still gets through."""
        if not claims:
            return []
        try:
            step(claims)
            return claims
        except Exception as e:
            if is_retriable(e):
                raise
            if len(claims) == 1:
                self.outcomes[claims[0].job_id] = self._job_failed(claims[0], stage, e)
                return []
            log.warning(
                "%s of a batch of %d jobs failed (%s); one job at a time",
                stage, len(claims), describe_error(e),
            )  # fmt: skip
        return self.each_alone(claims, stage, lambda c: step([c]))

    def write_in_own_transaction(self, claims: list[Claim]) -> None:
        """The batch's write; its jobs count as finished only once it has committed (a
        commit that fails releases them like any other unfinished job)."""
        with self.transactions() as uow:
            written = write_batch(uow, claims, self.vectors(uow.session), self.queue)
        self.outcomes.update(written)

    def _job_failed(self, claim: Claim, stage: str, error: Exception) -> JobOutcome:
        """Record that ``claim``'s job failed at ``stage``. Content the parser refuses is the
        upload's own fault (``failed``, with the reason); any other error is dead-lettered,
        where an operator can replay it once its cause is fixed. Errors a retry may fix are
        not a job's own: they propagate and release the whole batch."""
        if is_retriable(error):
            raise error
        dead_letter = not isinstance(error, ParseError)
        with job_context(str(claim.job_id), claim.request_id):
            log.warning("job failed at %s: %s", stage, describe_error(error), exc_info=dead_letter)
        try:
            with self.transactions() as uow:
                jobs.fail(
                    uow, claim.job_id, stage, error, dead_letter=dead_letter, queue=self.queue
                )
        except Exception as refused:
            if is_retriable(refused):
                raise
            # Recording this failure failed for a reason of the error's own (what it says):
            # the job fails with its class alone, rather than the batch with the write.
            log.exception("job %s: its failure could not be recorded as it was", claim.job_id)
            error = UnrecordedError(
                f"{type(error).__name__} at {stage}; its message could not be recorded "
                f"({describe_error(refused)})"
            )
            with self.transactions() as uow:
                jobs.fail(
                    uow, claim.job_id, stage, error, dead_letter=dead_letter, queue=self.queue
                )
        state = JobState.DEAD_LETTERED if dead_letter else JobState.FAILED
        return JobOutcome(
            str(claim.job_id), state, {"error": describe_error(error), "stage": stage}
        )


# Jobs this process gave up while Postgres was out of reach (so it could not hand them back),
# by id: (when its claim began, whether that attempt was lost). Their leases would keep
# them from anyone for up to job_lease_seconds after Postgres returns; instead the process's
# next task hands them back first (the claim's start tells a job since claimed again by another
# worker, which is left alone). Should the process die first, the leases run out as before.
_owed_releases: dict[uuid.UUID, tuple[datetime | None, bool]] = {}


def _release(
    transactions: Transactions,
    claims: dict[uuid.UUID, datetime | None],
    settings: Settings,
    retried_by_task: uuid.UUID | None,
    lost: bool,
    *,
    queue: TaskQueue,
) -> None:
    """Hand unfinished jobs (``claims``: when this batch's claim of each began) back to
    the queue (shared/jobs/service.release). If Postgres is out of reach too, they are owed:
    handed back by this process's next task (:func:`settle_owed_releases`)."""
    if not claims:
        return
    try:
        with transactions() as uow:
            jobs.release(uow, claims, settings, retried_by_task, lost, queue=queue)
    except Exception as e:
        log.warning("could not release %d jobs (%s); the next task will", len(claims), e)
        _owed_releases.update({job_id: (at, lost) for job_id, at in claims.items()})


def settle_owed_releases(
    transactions: Transactions, settings: Settings, *, queue: TaskQueue
) -> None:
    """Hand back the jobs this process owes (see ``_owed_releases``), each with a message of
    its own. If Postgres is still out of reach, they stay owed and the task's own error
    (the same one) follows."""
    if not _owed_releases:
        return
    owed = dict(_owed_releases)
    try:
        with transactions() as uow:
            for lost in (False, True):
                claims = {j: at for j, (at, was_lost) in owed.items() if was_lost is lost}
                if claims:
                    jobs.release(uow, claims, settings, None, lost, queue=queue)
    except Exception as e:
        log.warning("could not hand back %d jobs yet (%s)", len(owed), e)
        return
    for job_id in owed:
        _owed_releases.pop(job_id, None)
    log.info("handed back %d jobs a batch gave up while Postgres was out of reach", len(owed))


# ------------------------------------------------------------------ the steps


def parse_job(claim: Claim, settings: Settings) -> None:
    with StageTimes(claim.timings).stage("parse"):
        claim.parsed = parse(claim.raw, claim.content_type, options_from(settings))
        claim.parse_notes = claim.parsed.notes


def chunk_job(claim: Claim, chunker: Chunker, max_chunks: int) -> None:
    assert claim.parsed is not None
    with StageTimes(claim.timings).stage("chunk"):
        pieces = chunker.chunk(claim.parsed)
        claim.parsed = None  # the chunks hold what is needed now
        if len(pieces) > max_chunks:
            raise ParseError(
                f"the document makes {len(pieces)} chunks; the limit is {max_chunks} "
                "(CONCORD_MAX_CHUNKS_PER_DOCUMENT): split it into several documents"
            )
        claim.pieces = pieces
        claim.hashes = [text_hash(p.text) for p in pieces]


MAX_TURNS = 8


# A batch is embedded and written a group of at least this many chunks at a time, in its
# fair order: the batch's first jobs (another tenant's small upload, most often) are written
# once their own group is encoded, not after every batch-mate's chunks (a batch of 256 KiB
# took 7 s on this machine's two busy cores; a group of 64 chunks about 1.5 s). Encoder
# calls stay as full (their batch is 32 chunks).
WRITE_GROUP_CHUNKS = 64


def write_groups(claims: list[Claim], chunks: int) -> list[list[Claim]]:
    """``claims`` in their order, cut into consecutive groups of at least ``chunks``
    chunks each (the last one may hold fewer); a job is never split."""
    groups: list[list[Claim]] = [[]]
    held = 0
    for claim in claims:
        if held >= chunks:
            groups.append([])
            held = 0
        groups[-1].append(claim)
        held += len(claim.pieces)
    return [g for g in groups if g]


def embed_batch(
    claims: list[Claim],
    embedder: Embedder,
    transactions: Transactions,
    commit_every: int,
    context: ChunkContext = "none",
    turn_chunks: int | None = None,
) -> int:
    """Encode every chunk of the batch that this model has never embedded (as what
    ``context`` makes of it: the chunk alone, or after its document's title and its section
    path); each job is charged its share of the time by chunk count. The vectors are cached
    by a hash of exactly what was encoded, ``commit_every`` chunks at a time, each part in a
    transaction of its own, so that an attempt cut short (a time limit, a crash) leaves its
    work for the next one: a document of any size gets through in the end.

    At most ``turn_chunks`` chunks are encoded (claims in batch order): a claim with chunks
    left after that gets ``left_to_encode`` instead of its vectors, for its next turn.
    Returns how many chunks were encoded."""
    started = time.perf_counter()
    # Before any transaction opens: the first call in a process may load the model and
    # export it to ONNX, which must not hold a transaction (and its locks) meanwhile.
    model_id = embedder.model_id
    with transactions() as uow:
        encoded, keys = _what_to_encode(uow, claims, context)
        all_keys = [k for c in claims for k in keys[c.job_id]]
        cached = repo.cached_embeddings(uow.session, model_id, all_keys)
    texts = {k: t for c in claims for k, t in zip(keys[c.job_id], encoded[c.job_id], strict=True)}
    tokens = {
        k: p.token_count for c in claims for k, p in zip(keys[c.job_id], c.pieces, strict=True)
    }
    missing = [k for k in dict.fromkeys(all_keys) if k not in cached]
    if turn_chunks is not None:
        # Each turn parses and chunks its documents again: a very large one takes at most
        # MAX_TURNS turns, larger ones then (8,000 chunks: 1,000 a turn).
        missing = missing[: max(turn_chunks, math.ceil(len(all_keys) / MAX_TURNS))]
    fresh: dict[str, np.ndarray] = {}
    for start in range(0, len(missing), commit_every):
        part = missing[start : start + commit_every]
        vectors = embedder.embed_passages(
            [texts[k] for k in part],
            # the chunker counted the chunks' tokens; with a context the encoder counts again
            token_counts=[tokens[k] for k in part] if context == "none" else None,
        )
        made = dict(zip(part, vectors, strict=True))
        with transactions() as uow:
            repo.store_embeddings(uow.session, model_id, made)
        fresh.update(made)
    elapsed = time.perf_counter() - started
    for claim in claims:
        own = keys[claim.job_id]
        claim.left_to_encode = sum(1 for k in own if k not in cached and k not in fresh)
        if claim.left_to_encode:
            continue
        claim.vectors = [cached[k] if k in cached else fresh[k] for k in own]
        claim.cache_hits = sum(1 for k in own if k in cached)
        share = len(claim.hashes) / max(len(all_keys), 1)
        claim.timings["embed"] = round(elapsed * share, 4)
    return len(missing)


def _what_to_encode(
    uow: UnitOfWork, claims: list[Claim], context: ChunkContext
) -> tuple[dict[uuid.UUID, list[str]], dict[uuid.UUID, list[str]]]:
    """Per job, the text each chunk is encoded as (alone, or after its document's title and
    section path) and the key its vector is cached under: a hash of exactly that text (the
    chunk's own hash where that is its text)."""
    titles = (
        {}
        if context == "none"
        else {
            doc_id: doc.title
            for doc_id, doc in documents_repo.documents_by_ids(
                uow.session, [c.document_id for c in claims]
            ).items()
        }
    )
    encoded = {
        c.job_id: [
            contextual_text(p.text, titles.get(c.document_id, ""), p.section, context, p.flags)
            for p in c.pieces
        ]
        for c in claims
    }
    keys = {
        c.job_id: [
            known if text == p.text else text_hash(text)
            for known, text, p in zip(c.hashes, encoded[c.job_id], c.pieces, strict=True)
        ]
        for c in claims
    }
    return encoded, keys


def write_batch(
    uow: UnitOfWork, claims: list[Claim], vectors: VectorWriter, queue: TaskQueue
) -> dict[uuid.UUID, JobOutcome]:
    """Write the batch in the caller's transaction with a fixed number of statements whatever
    its size: the documents' locks, the jobs, the documents, the chunks, the superseded chunks
    and the outbox rows each take one round trip."""
    write_started = time.perf_counter()
    session = uow.session
    lock_keys(session, [f"document:{c.document_id}" for c in claims])
    locked = jobs_repo.lock_jobs(session, [c.job_id for c in claims])
    docs = documents_repo.documents_by_ids(session, [c.document_id for c in claims])
    finished_at = now(session)
    outcomes: dict[uuid.UUID, JobOutcome] = {}
    finished: list[tuple[IngestJob, Claim]] = []
    writes: dict[uuid.UUID, Claim] = {}  # document id -> the one claim writing it
    for claim in claims:
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
            writes.setdefault(claim.document_id, claim)
            detail = {
                "chunks": len(claim.pieces),
                "cache_hits": claim.cache_hits,
                "embedded": len(claim.pieces) - claim.cache_hits,
            }
            if claim.parse_notes:
                detail["parse_notes"] = claim.parse_notes
        if claim.request_id:
            detail["request_id"] = claim.request_id
        jobs.finish(job, detail, finished_at)
        outcomes[claim.job_id] = JobOutcome(str(claim.job_id), JobState.INDEXED, detail)
        finished.append((job, claim))
    _write_versions(uow, list(writes.values()), docs, vectors, queue)
    webhooks.job_finished(uow, [job for job, _ in finished], queue=queue)  # one statement
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
    uow: UnitOfWork,
    claims: list[Claim],
    docs: dict[uuid.UUID, Document],
    store: VectorWriter,
    queue: TaskQueue,
) -> None:
    """The chunks and embeddings of each claimed live version, the removal of the chunks
    they supersede, and the outbox rows that carry both to Elasticsearch; the relay is
    nudged once they are committed."""
    if not claims:
        return
    store.upsert(
        [
            VersionChunks(
                tenant_id=c.tenant_id,
                document_id=c.document_id,
                version=c.version,
                external_id=docs[c.document_id].external_id,
                title=docs[c.document_id].title,
                metadata=docs[c.document_id].metadata_ or {},
                rows=_chunk_rows(c),
            )
            for c in claims
        ]
    )
    # The counts remove a version's own chunks past its new count: a version chunked again
    # (concord reembed after a chunking change) may have fewer chunks than before.
    removed = store.delete_superseded(
        {c.document_id: c.version for c in claims}, {c.document_id: len(c.pieces) for c in claims}
    )
    entries = []
    for c in claims:
        live_ids = sorted(chunk_id(c.document_id, p.ordinal) for p in c.pieces)
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


def _chunk_rows(claim: Claim) -> list[ChunkRow]:
    return [
        ChunkRow(
            id=chunk_id(claim.document_id, p.ordinal),
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
        for p, h, v in zip(claim.pieces, claim.hashes, claim.vectors, strict=True)
    ]
