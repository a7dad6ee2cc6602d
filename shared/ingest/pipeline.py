"""The ingest pipeline: claim → parse → chunk → embed → write, each step a function from
values to new values (shared/ingest/steps.py, values.py), run here over a batch of jobs.

:func:`process_job` (what the task runs, with the task's ``transactions``) claims in one
transaction (shared/ingest/claiming.py), then :func:`run` passes the batch forward step by
step and opens every transaction a step needs with the same ``transactions``: the embedding
cache's reads and writes (every ``embed_commit_chunks`` chunks), the transaction of
:func:`write_batch` for each group of the batch (shared/ingest/write.py), a failure's own
record. No step opens a transaction of its own accord.

    Claim ─parse_step─▶ Parsed ─chunk_step─▶ Chunked ─┬─embed_step─▶ Encoded ─write_batch─▶ outcome
                                   (in groups of WRITE_GROUP_CHUNKS) └──────────▶ Waiting (queued)

A job's failure at any step is its own: the step's value for it is dropped and its failure
recorded (:class:`_Steps`), and its batch-mates go on.

A task delivers one job id, but the worker also claims up to ``ingest_batch_jobs - 1`` other
queued jobs and embeds all their chunks together, so a busy queue is processed in batches
(fewer transactions and tasks, fuller encoder batches). The claimed jobs' own messages arrive
later and find them finished or still running in that batch: a duplicate delivery, a no-op.

Every step is safe to run twice: chunk ids are deterministic, writes are version-guarded, and a
job whose document has moved on to a newer version finishes without writing anything.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, TypeVar

from billiard.exceptions import SoftTimeLimitExceeded
from sqlalchemy.orm import Session

from shared.db import Transactions
from shared.documents import repository as documents_repo
from shared.errors import ParseError
from shared.ingest.chunking import ChunkContext
from shared.ingest.claiming import claim, claim_listed
from shared.ingest.embedding import get_embedder
from shared.ingest.steps import chunk_step, embed_step, make_chunker, parse_step
from shared.ingest.values import Chunked, Claim, Encoded, JobOutcome, Waiting
from shared.ingest.write import write_batch
from shared.jobs import service as jobs
from shared.jobs.heartbeat import LeaseHeartbeat
from shared.logs import job_context
from shared.models import JobState
from shared.parsing import options_from
from shared.queue import TaskQueue
from shared.retry import describe_error, is_retriable
from shared.settings import Settings, get_settings
from shared.stores.compose import Stores
from shared.stores.ports import CachedEmbeddings, VectorWriter

__all__ = ["Claim", "JobOutcome", "claim", "claim_listed", "process_job", "process_jobs", "run"]

log = logging.getLogger(__name__)


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
    with LeaseHeartbeat([c.job_id for c in claims], transactions, settings):
        try:
            _run_steps(steps, claims, stores.embeddings(transactions), settings)
        except Exception as e:
            unfinished = {c.job_id: c.claimed_at for c in claims if c.job_id not in steps.outcomes}
            # Out of time or of memory: no job's own outcome, and any of them may be the
            # reason.
            lost = isinstance(e, (SoftTimeLimitExceeded, MemoryError))
            _release(transactions, unfinished, settings, retried_by_task, lost, queue=stores.queue)
            raise
    return steps.outcomes


def _run_steps(
    steps: _Steps, claims: list[Claim], cache: CachedEmbeddings, settings: Settings
) -> None:
    """The batch forward step by step, the embed and write steps a group at a time; each
    job's outcome in ``steps.outcomes``."""
    embedder = get_embedder()
    chunker = make_chunker(settings, embedder)
    options = options_from(settings)
    parsed = steps.each_alone(claims, "parse", lambda c: parse_step(c, options))
    chunked = steps.each_alone(
        parsed, "chunk", lambda p: chunk_step(p, chunker, settings.max_chunks_per_document)
    )
    del parsed  # the parsed texts: the chunks hold what is needed now
    turn_left = settings.ingest_turn_chunks  # chunks the batch may still encode
    titles = _titles(steps.transactions, chunked, settings.chunk_context)  # one read a batch

    def embed(group: list[Chunked]) -> list[Encoded | Waiting]:
        nonlocal turn_left
        turn = embed_step(
            group,
            embedder,
            cache,
            commit_every=min(settings.embed_commit_chunks, settings.ingest_turn_chunks),
            context=settings.chunk_context,
            titles=titles,
            turn_chunks=turn_left,
        )
        turn_left -= turn.encoded
        return turn.results

    for group in write_groups(chunked, WRITE_GROUP_CHUNKS):
        embedded: list[Encoded | Waiting] = (
            steps.together(group, "embed", embed)
            if turn_left > 0  # else the turn is spent: the rest take their next one
            else [Waiting(c, len(c.pieces)) for c in group]
        )
        encoded = steps.wait_their_turn(embedded, settings)
        steps.together(encoded, "write", steps.write_in_own_transaction)


def _titles(
    transactions: Transactions, batch: list[Chunked], context: ChunkContext
) -> Mapping[uuid.UUID, str]:
    """The documents' titles, where chunks are encoded after their title."""
    if context == "none":
        return {}
    with transactions() as uow:
        found = documents_repo.documents_by_ids(uow.session, [c.claim.document_id for c in batch])
        return {doc_id: doc.title for doc_id, doc in found.items()}


class OfAJob(Protocol):
    """A step's value: it knows whose job it is."""

    @property
    def claim(self) -> Claim: ...


In = TypeVar("In", bound=OfAJob)
Out = TypeVar("Out")


class UnrecordedError(Exception):
    """A job's error whose own message the database refused to record."""


@dataclass
class _Steps:
    """Runs a step over the batch's values and records the outcome of each job it failed, in
    a transaction of its own."""

    transactions: Transactions
    vectors: Callable[[Session], VectorWriter]  # the vector store in a write's transaction
    queue: TaskQueue
    outcomes: dict[uuid.UUID, JobOutcome]

    def wait_their_turn(
        self, embedded: list[Encoded | Waiting], settings: Settings
    ) -> list[Encoded]:
        """The documents whose chunks are all encoded; the others (a large document, more
        chunks than a turn encodes) go back to the queue, their encoded chunks cached, and
        come back in their tenant's next turn: one upload of 10 MiB holds a worker for turns
        of ``ingest_turn_chunks`` chunks, with other tenants' work between them, not for
        minutes."""
        waiting = [w for w in embedded if isinstance(w, Waiting)]
        if waiting:
            with self.transactions() as uow:
                ids = [w.claim.job_id for w in waiting]
                jobs.wait_next_turn(uow, ids, settings, queue=self.queue)
        for w in waiting:
            detail = {"chunks": len(w.chunked.hashes), "left_to_encode": w.left_to_encode}
            self.outcomes[w.claim.job_id] = JobOutcome(str(w.claim.job_id), JobState.QUEUED, detail)
        return [e for e in embedded if isinstance(e, Encoded)]

    def each_alone(self, batch: list[In], stage: str, step: Callable[[In], Out]) -> list[Out]:
        """``step`` of each value; a value it fails for is dropped (the later steps skip
        it) and its job's failure recorded."""
        done = []
        for value in batch:
            try:
                done.append(step(value))
            except Exception as e:
                self.outcomes[value.claim.job_id] = self._job_failed(value.claim, stage, e)
        return done

    def together(
        self, batch: list[In], stage: str, step: Callable[[list[In]], list[Out]]
    ) -> list[Out]:
        """``step`` of the batch at once (one encoder call, one transaction); if that fails
        for a reason a retry will not fix, of each value alone, so that the error is charged
        to the job that caused it and every other job still gets through."""
        if not batch:
            return []
        try:
            return step(batch)
        except Exception as e:
            if is_retriable(e):
                raise
            if len(batch) == 1:
                self.outcomes[batch[0].claim.job_id] = self._job_failed(batch[0].claim, stage, e)
                return []
            log.warning(
                "%s of a batch of %d jobs failed (%s); one job at a time",
                stage, len(batch), describe_error(e),
            )  # fmt: skip
        return self.each_alone(batch, stage, lambda value: step([value])[0])

    def write_in_own_transaction(self, batch: list[Encoded]) -> list[JobOutcome]:
        """The batch's write; its jobs count as finished only once it has committed (a
        commit that fails releases them like any other unfinished job)."""
        with self.transactions() as uow:
            written = write_batch(uow, batch, self.vectors(uow.session), self.queue)
        self.outcomes.update(written)
        return list(written.values())

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


# A batch is embedded and written a group of at least this many chunks at a time, in its
# fair order: the batch's first jobs (another tenant's small upload, most often) are written
# once their own group is encoded, not after every batch-mate's chunks (a batch of 256 KiB
# took 7 s on this machine's two busy cores; a group of 64 chunks about 1.5 s). Encoder
# calls stay as full (their batch is 32 chunks).
WRITE_GROUP_CHUNKS = 64


def write_groups(batch: list[Chunked], chunks: int) -> list[list[Chunked]]:
    """``batch`` in its order, cut into consecutive groups of at least ``chunks`` chunks
    each (the last one may hold fewer); a document is never split."""
    groups: list[list[Chunked]] = [[]]
    held = 0
    for chunked in batch:
        if held >= chunks:
            groups.append([])
            held = 0
        groups[-1].append(chunked)
        held += len(chunked.pieces)
    return [g for g in groups if g]
