"""All SQL of jobs and dead letters: claims, leases, the sweep's queries, the operator's views.
Functions take a session and never commit."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Integer, cast, delete, func, select, text, tuple_, update
from sqlalchemy.dialects.postgresql import distinct_on
from sqlalchemy.orm import Session

from shared.db import any_of, starts_with
from shared.db.repository import count_rows
from shared.models import DeadLetter, Document, DocumentVersion, IngestJob, JobState, TrainingJob

# ------------------------------------------------------------------ one job


def job_for_tenant(session: Session, tenant_id: str, job_id: uuid.UUID) -> IngestJob | None:
    return session.scalar(
        select(IngestJob).where(IngestJob.id == job_id, IngestJob.tenant_id == tenant_id)
    )


def job_by_id(session: Session, job_id: uuid.UUID) -> IngestJob | None:
    return session.get(IngestJob, job_id)


def lock_job(session: Session, job_id: uuid.UUID) -> IngestJob | None:
    return session.scalar(select(IngestJob).where(IngestJob.id == job_id).with_for_update())


def lock_jobs(session: Session, job_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, IngestJob]:
    """:func:`lock_job` for many jobs in one query (locked in id order)."""
    if not job_ids:
        return {}
    jobs = session.scalars(
        select(IngestJob)
        .where(any_of(IngestJob.id, job_ids))
        .order_by(IngestJob.id)
        .with_for_update()
    )
    return {job.id: job for job in jobs}


def job_state(session: Session, job_id: uuid.UUID) -> tuple[str, bool] | None:
    """The job's state and whether its lease is live (by the database clock)."""
    row = session.execute(
        select(IngestJob.state, IngestJob.lease_expires_at > func.now()).where(
            IngestJob.id == job_id
        )
    ).one_or_none()
    return None if row is None else (row[0], bool(row[1]))


# ------------------------------------------------------------------ claims and leases


# Queued jobs in fair order over tenants, by bytes: each candidate is ordered by how much raw
# content its tenant has running and queued before it (start tag of byte-weighted fair
# queuing), so a tenant of small uploads gets as many turns as one whose uploads are large
# gets bytes, and a tenant with work running waits behind those with none. A tenant with
# ``tenant_running`` jobs running already comes after every other tenant (but still before
# nothing: a worker never idles while work is queued). Tenants with queued jobs are found by a
# loose index scan (one probe of ix_ingest_jobs_queued_tenant per tenant, however many jobs
# each has queued), and each tenant's first ``limit`` jobs by a probe more.
_FAIR_QUEUED = text(
    """
    WITH RECURSIVE tenants AS (
      (SELECT tenant_id FROM ingest_jobs WHERE state = 'queued' ORDER BY tenant_id LIMIT 1)
      UNION ALL
      SELECT (SELECT j.tenant_id FROM ingest_jobs j
              WHERE j.state = 'queued' AND j.tenant_id > t.tenant_id
              ORDER BY j.tenant_id LIMIT 1)
      FROM tenants t WHERE t.tenant_id IS NOT NULL
    ),
    running AS (
      SELECT j.tenant_id, count(*) AS jobs, sum(coalesce(octet_length(v.raw), 0)) AS bytes
      FROM ingest_jobs j
      JOIN document_versions v ON v.document_id = j.document_id AND v.version = j.version
      WHERE j.state = 'running' AND j.lease_expires_at > now()
      GROUP BY j.tenant_id
    )
    SELECT turns.id FROM tenants t
    LEFT JOIN running r ON r.tenant_id = t.tenant_id
    CROSS JOIN LATERAL (
      SELECT q.id, q.created_at, sum(q.size) OVER (ORDER BY q.created_at, q.id) - q.size AS before
      FROM (
        SELECT j.id, j.created_at, coalesce(octet_length(v.raw), 0) AS size
        FROM ingest_jobs j
        JOIN document_versions v ON v.document_id = j.document_id AND v.version = j.version
        WHERE j.state = 'queued' AND j.tenant_id = t.tenant_id
          AND j.attempts_lost < :alone_after_lost
        ORDER BY j.created_at, j.id
        LIMIT :limit
      ) q
    ) turns
    WHERE t.tenant_id IS NOT NULL
    ORDER BY coalesce(r.jobs, 0) >= :tenant_running, coalesce(r.bytes, 0) + turns.before,
             turns.created_at, turns.id
    LIMIT :limit
    """
)


def claim_fair_batch(
    session: Session,
    limit: int,
    max_bytes: int,
    alone_after_lost: int,
    tenant_running: int,
) -> Sequence[IngestJob]:
    """Up to ``limit`` queued jobs no one else is claiming right now, in fair order over
    tenants (``_FAIR_QUEUED``), whose raw content fits ``max_bytes`` together: a candidate
    that does not fit is skipped, not the end of the batch (a flooding tenant's large next
    job must not keep another tenant's small one out). The first candidate is taken whatever
    its size: a document larger than the budget is a batch of its own. Locked."""
    if limit <= 0:
        return []
    # Twice the batch: candidates another worker locks meanwhile are skipped, not waited for.
    turns = list(
        session.scalars(
            _FAIR_QUEUED,
            {"alone_after_lost": alone_after_lost, "limit": 2 * limit,
             "tenant_running": max(1, tenant_running)},
        )
    )  # fmt: skip
    if not turns:
        return []
    rows = session.execute(
        select(IngestJob, func.coalesce(func.octet_length(DocumentVersion.raw), 0))
        .join(
            DocumentVersion,
            (DocumentVersion.document_id == IngestJob.document_id)
            & (DocumentVersion.version == IngestJob.version),
        )
        .where(any_of(IngestJob.id, turns), IngestJob.state == JobState.QUEUED)
        .with_for_update(of=IngestJob, skip_locked=True)
    ).all()
    locked = {job.id: (job, size) for job, size in rows}
    taken: list[IngestJob] = []
    total = 0
    for job_id in turns:
        if job_id not in locked or len(taken) == limit:
            continue
        job, size = locked[job_id]
        if taken and total + size > max_bytes:
            continue
        taken.append(job)
        total += size
    return taken


def claimable_jobs(session: Session, job_ids: Sequence[uuid.UUID]) -> Sequence[IngestJob]:
    """Of ``job_ids``, those queued, or running under a lease that has run out, and not being
    claimed by anyone else right now; locked."""
    if not job_ids:
        return []
    return session.scalars(
        select(IngestJob)
        .where(
            any_of(IngestJob.id, job_ids),
            (IngestJob.state == JobState.QUEUED)
            | ((IngestJob.state == JobState.RUNNING) & (IngestJob.lease_expires_at < func.now())),
        )
        .order_by(IngestJob.id)
        .with_for_update(skip_locked=True)
    ).all()


def renew_leases(session: Session, job_ids: Sequence[uuid.UUID], seconds: int) -> None:
    """The heartbeat: the leases of those of ``job_ids`` still running, from the database's
    clock."""
    session.execute(
        update(IngestJob)
        .where(any_of(IngestJob.id, job_ids), IngestJob.state == JobState.RUNNING)
        .values(lease_expires_at=func.now() + timedelta(seconds=seconds))
    )


def expired_jobs(session: Session, limit: int) -> Sequence[IngestJob]:
    """Queued or running jobs whose lease ran out: their message or worker was lost."""
    return session.scalars(
        select(IngestJob)
        .where(
            IngestJob.state.in_([JobState.QUEUED, JobState.RUNNING]),
            IngestJob.lease_expires_at < func.now(),
        )
        .order_by(IngestJob.lease_expires_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    ).all()


def queued_jobs_published_before(
    session: Session, published_before: datetime, lease_seconds: int, limit: int
) -> Sequence[IngestJob]:
    """Queued jobs whose message went out before ``published_before`` (a lease starts when
    its message is published), oldest first."""
    return session.scalars(
        select(IngestJob)
        .where(
            IngestJob.state == JobState.QUEUED,
            IngestJob.lease_expires_at < published_before + timedelta(seconds=lease_seconds),
        )
        .order_by(IngestJob.lease_expires_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    ).all()


# ------------------------------------------------------------------ jobs of documents


def latest_jobs_for(
    session: Session, versions: Collection[tuple[uuid.UUID, int]]
) -> dict[tuple[uuid.UUID, int], tuple[uuid.UUID, str]]:
    """(document id, version) -> the id and state of its newest job, for many in one query."""
    if not versions:
        return {}
    rows = session.execute(
        select(IngestJob.document_id, IngestJob.version, IngestJob.id, IngestJob.state)
        .ext(distinct_on(IngestJob.document_id, IngestJob.version))
        .where(tuple_(IngestJob.document_id, IngestJob.version).in_(list(versions)))
        .order_by(IngestJob.document_id, IngestJob.version, IngestJob.created_at.desc())
    )
    return {(document_id, version): (job_id, state) for document_id, version, job_id, state in rows}


def newest_job(session: Session, document_id: uuid.UUID, version: int) -> IngestJob | None:
    """The newest job of a document's version (a replayed one's retry, say)."""
    return session.scalars(
        select(IngestJob)
        .where(IngestJob.document_id == document_id, IngestJob.version == version)
        .order_by(IngestJob.created_at.desc())
        .limit(1)
    ).first()


def live_job_states(
    session: Session, tenant_id: str, external_ids: Sequence[str]
) -> dict[str, str]:
    """external id -> state of the job for the document's live version (when there is one)."""
    if not external_ids:
        return {}
    rows = session.execute(
        select(Document.external_id, IngestJob.state)
        .join(
            IngestJob,
            (IngestJob.document_id == Document.id) & (IngestJob.version == Document.version),
        )
        .where(Document.tenant_id == tenant_id, any_of(Document.external_id, external_ids))
    ).all()
    return {external_id: state for external_id, state in rows}


def upload_outcomes(
    session: Session,
    tenant_id: str,
    external_ids: Sequence[str],
    since: datetime,
    awaiting_new_jobs: Collection[str] = (),
) -> dict[str, tuple[str, str | None]]:
    """external id -> (state, why it failed) of what became of an upload sent at ``since``
    (the database's clock): its live version's newest job (``failed`` and ``dead_lettered``
    with the job's error), or ``dead_lettered`` with the reason when the upload event itself
    was refused at intake (an event that never became a document has no job to wait for).
    For ``awaiting_new_jobs`` (uploads that make a job: new or changed content, or a retry)
    only a job made since counts: until the upload is accepted, the document's job is the
    previous attempt's, and its ``failed`` would be the wrong answer."""
    if not external_ids:
        return {}
    outcomes: dict[str, tuple[str, str | None]] = {}
    jobs = session.execute(
        select(Document.external_id, IngestJob.state, IngestJob.error_message, IngestJob.created_at)
        .join(
            IngestJob,
            (IngestJob.document_id == Document.id) & (IngestJob.version == Document.version),
        )
        .where(Document.tenant_id == tenant_id, any_of(Document.external_id, external_ids))
        .order_by(IngestJob.created_at)  # a version's retry after its failed job
    ).all()
    awaiting = set(awaiting_new_jobs)
    for external_id, state, error, created_at in jobs:
        if external_id in awaiting and created_at < since:
            continue
        outcomes[external_id] = (state, error if state in ("failed", "dead_lettered") else None)
    refused = session.execute(
        select(DeadLetter.ref, DeadLetter.message)
        .where(
            DeadLetter.tenant_id == tenant_id,
            DeadLetter.source == "event",
            DeadLetter.created_at >= since,
            any_of(DeadLetter.ref, external_ids),
        )
        .order_by(DeadLetter.id)
    ).all()
    for external_id, message in refused:
        if outcomes.get(external_id, ("",))[0] != "indexed":
            outcomes[external_id] = ("dead_lettered", message)
    return outcomes


@dataclass
class FailedAttempts:
    """What a tenant's uploads under a prefix already failed with, for ``concord sync`` not to
    send the same content again: live versions whose newest job failed or was dead-lettered
    (external id -> the version's content hash), and upload events refused at intake (external
    id -> the SHA-256 of each refused content, as their dead letters keep it)."""

    versions: dict[str, str] = field(default_factory=dict)
    refusals: dict[str, set[str]] = field(default_factory=dict)


def failed_attempts(
    session: Session, tenant_id: str, prefix: str, among: Sequence[str] | None = None
) -> FailedAttempts:
    """(``among``: only these external ids.)"""
    newest = (
        select(Document.external_id, Document.content_hash, IngestJob.state)
        .join(
            IngestJob,
            (IngestJob.document_id == Document.id) & (IngestJob.version == Document.version),
        )
        .ext(distinct_on(Document.id))
        .where(
            Document.tenant_id == tenant_id,
            Document.deleted.is_(False),
            starts_with(Document.external_id, prefix),
            *([any_of(Document.external_id, among)] if among is not None else []),
        )
        .order_by(Document.id, IngestJob.created_at.desc())
        .subquery()
    )
    attempts = FailedAttempts()
    for external_id, digest in session.execute(
        select(newest.c.external_id, newest.c.content_hash).where(
            newest.c.state.in_([JobState.FAILED, JobState.DEAD_LETTERED])
        )
    ):
        attempts.versions[external_id] = digest
    refused = session.execute(
        select(DeadLetter.ref, DeadLetter.payload["content_sha256"].astext).where(
            DeadLetter.tenant_id == tenant_id,
            DeadLetter.source == "event",
            starts_with(DeadLetter.ref, prefix),
            DeadLetter.payload.has_key("content_sha256"),
            *([any_of(DeadLetter.ref, among)] if among is not None else []),
        )
    )
    for external_id, digest in refused:
        attempts.refusals.setdefault(external_id, set()).add(digest)
    return attempts


# ------------------------------------------------------------------ the operator's views


def recent_jobs(
    session: Session, *, state: str | None, stuck: bool, tenant_id: str | None, limit: int
) -> Sequence[IngestJob]:
    """Newest first; ``stuck``: queued or running past their lease."""
    query = select(IngestJob).order_by(IngestJob.created_at.desc()).limit(limit)
    if state:
        query = query.where(IngestJob.state == state)
    if stuck:
        query = query.where(
            IngestJob.state.in_([JobState.QUEUED, JobState.RUNNING]),
            IngestJob.lease_expires_at < func.now(),
        )
    if tenant_id:
        query = query.where(IngestJob.tenant_id == tenant_id)
    return session.scalars(query).all()


def queued_bytes(session: Session, tenant_id: str) -> int:
    """Raw bytes of the tenant's queued jobs' content (ix_ingest_jobs_queued_tenant)."""
    total = session.scalar(
        select(func.coalesce(func.sum(func.octet_length(DocumentVersion.raw)), 0))
        .select_from(IngestJob)
        .join(
            DocumentVersion,
            (DocumentVersion.document_id == IngestJob.document_id)
            & (DocumentVersion.version == IngestJob.version),
        )
        .where(IngestJob.tenant_id == tenant_id, IngestJob.state == JobState.QUEUED)
    )
    return int(total or 0)


def tenants_with_jobs_in_flight(session: Session) -> set[str]:
    """Tenants with an ingest job queued or running: their ingest has not settled."""
    rows = session.scalars(
        select(IngestJob.tenant_id).where(IngestJob.state.in_(("queued", "running"))).distinct()
    )
    return set(rows)


def job_state_counts(session: Session, tenant_id: str | None = None) -> dict[str, int]:
    query = select(IngestJob.state, func.count()).group_by(IngestJob.state)
    if tenant_id is not None:
        query = query.where(IngestJob.tenant_id == tenant_id)
    return {state: count for state, count in session.execute(query)}


def stage_time_totals(session: Session) -> dict[str, tuple[int, float]]:
    """stage -> (jobs that recorded it, total seconds), over finished jobs."""
    rows = session.execute(
        text(
            "SELECT key, count(*), sum(value::float) FROM ingest_jobs, "
            "jsonb_each_text(stage_timings) WHERE state = 'indexed' GROUP BY key"
        )
    )
    return {stage: (int(count), float(total)) for stage, count, total in rows}


def format_figures(session: Session) -> list[tuple[str, str, int, float, int]]:
    """Per content type and job state: jobs, total parse seconds and jobs that recorded a
    parse (the parse stage of a job's timings)."""
    rows = session.execute(
        text(
            "SELECT v.content_type, j.state, count(*), "
            "coalesce(sum((j.stage_timings->>'parse')::float), 0), "
            "count(j.stage_timings->>'parse') "
            "FROM ingest_jobs j JOIN document_versions v "
            "ON v.document_id = j.document_id AND v.version = j.version "
            "GROUP BY v.content_type, j.state"
        )
    )
    return [
        (str(ct), str(state), int(n), float(seconds), int(timed))
        for ct, state, n, seconds, timed in rows
    ]


def silent_training_jobs(
    session: Session, running_before: datetime | None, queued_before: datetime, limit: int
) -> Sequence[TrainingJob]:
    """Running training jobs that have written nothing since ``running_before`` (None: none
    are asked for) and queued ones silent since ``queued_before``, locked (skipping any a run
    is writing to right now)."""
    silent = (TrainingJob.state == "queued") & (TrainingJob.updated_at < queued_before)
    if running_before is not None:
        silent |= (TrainingJob.state == "running") & (TrainingJob.updated_at < running_before)
    return session.scalars(
        select(TrainingJob)
        .where(silent)
        .order_by(TrainingJob.updated_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    ).all()


def training_job_for_tenant(
    session: Session, tenant_id: str, job_id: uuid.UUID
) -> TrainingJob | None:
    job = session.get(TrainingJob, job_id)
    return job if job is not None and job.tenant_id == tenant_id else None


# ------------------------------------------------------------------ dead letters


def add_dead_letter(
    session: Session,
    *,
    tenant_id: str,
    source: str,
    ref: str,
    stage: str,
    error_class: str,
    message: str,
    attempts: int,
    payload: dict[str, Any] | None = None,
) -> None:
    session.add(
        DeadLetter(
            tenant_id=tenant_id,
            source=source,
            ref=ref,
            stage=stage,
            error_class=error_class,
            message=message[:4000],
            attempts=attempts,
            payload=payload or {},
        )
    )


def dead_letter(session: Session, letter_id: int) -> DeadLetter | None:
    """The letter, unless it was discarded."""
    letter = session.get(DeadLetter, letter_id)
    return None if letter is None or letter.discarded_at is not None else letter


def recent_dead_letters(
    session: Session, *, tenant_id: str | None, limit: int
) -> Sequence[DeadLetter]:
    query = (
        select(DeadLetter)
        .where(DeadLetter.discarded_at.is_(None))
        .order_by(DeadLetter.id.desc())
        .limit(limit)
    )
    if tenant_id:
        query = query.where(DeadLetter.tenant_id == tenant_id)
    return session.scalars(query).all()


def delete_dead_letter(session: Session, letter_id: int) -> None:
    session.execute(delete(DeadLetter).where(DeadLetter.id == letter_id))


def discard_dead_letter(session: Session, letter_id: int) -> None:
    """Hidden from now on, kept for what it refused (see the migration 0018)."""
    session.execute(
        update(DeadLetter).where(DeadLetter.id == letter_id).values(discarded_at=func.now())
    )


def dead_letter_count(session: Session, tenant_id: str | None = None) -> int:
    return count_rows(session, DeadLetter, tenant_id, DeadLetter.discarded_at.is_(None))


def dead_lettered_versions(session: Session, ids: Sequence[str]) -> dict[str, int]:
    """chunk id -> the newest version among its Elasticsearch writes that are dead letters not
    yet replayed or discarded."""
    if not ids:
        return {}
    version = cast(DeadLetter.payload["version"].astext, Integer)
    rows = session.execute(
        select(DeadLetter.ref, func.max(version))
        .where(
            DeadLetter.source == "outbox",
            any_of(DeadLetter.ref, ids),
            DeadLetter.discarded_at.is_(None),
        )
        .group_by(DeadLetter.ref)
    )
    return {ref: int(v) for ref, v in rows if v is not None}


def indexed_live_version_jobs(
    session: Session, tenant_id: str, after: uuid.UUID | None, limit: int
) -> list[IngestJob]:
    """The indexed jobs of the tenant's live documents at their live version, locked: the
    first ``limit`` in id order past ``after``."""
    query = (
        select(IngestJob)
        .join(
            Document,
            (Document.id == IngestJob.document_id) & (Document.version == IngestJob.version),
        )
        .where(
            IngestJob.tenant_id == tenant_id,
            Document.deleted.is_(False),
            IngestJob.state == JobState.INDEXED,
        )
        .order_by(IngestJob.id)
        .limit(limit)
        .with_for_update(of=IngestJob)
    )
    if after is not None:
        query = query.where(IngestJob.id > after)
    return list(session.scalars(query))


def job_states(session: Session, job_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, str]:
    rows = session.execute(
        select(IngestJob.id, IngestJob.state).where(any_of(IngestJob.id, job_ids))
    )
    return {job_id: state for job_id, state in rows}
