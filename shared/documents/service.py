"""Accept uploads (and deletes) into Postgres. Nothing here commits or enqueues directly: the
caller's unit of work commits, and only then are tasks published."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import uuid
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from shared.db import UnitOfWork
from shared.db.repository import insert_rows, lock_key, lock_keys, now
from shared.documents import repository as repo
from shared.documents.schemas import Upload, UploadResult
from shared.errors import ConcordError, NotFound, TooManyRequests
from shared.jobs import repository as jobs_repo
from shared.logs import current_request_id
from shared.models import Document, DocumentVersion, IngestJob, JobState, OutboxOp
from shared.outbox import repository as outbox_repo
from shared.queue import TaskQueue
from shared.retry import describe_error
from shared.settings import Settings
from shared.stores.ports import VectorWriter
from shared.tenants import repository as tenants_repo
from shared.text import storable_text


def content_hash(upload: Upload) -> str:
    """What makes two uploads the same: bytes, type, title and metadata."""
    digest = hashlib.sha256(upload.raw)
    digest.update(b"\0" + upload.content_type.encode())
    digest.update(b"\0" + upload.title.encode())
    digest.update(b"\0" + json.dumps(upload.metadata or {}, sort_keys=True).encode())
    return digest.hexdigest()


def accept_upload(
    uow: UnitOfWork, settings: Settings, upload: Upload, *, queue: TaskQueue | None
) -> UploadResult:
    """Commit the document, its raw content and a job; the job is published on ``queue``
    after commit (with None, the caller publishes the jobs it accepted together).

    Re-uploading unchanged content is a no-op that reports ``unchanged``; changed content
    becomes the next version."""
    result = accept_uploads(uow, settings, [upload])[0]
    if queue is not None and result.status == "accepted" and result.job_id is not None:
        job_id = result.job_id
        uow.after_commit(lambda: queue.publish_ingest_job(job_id))
    return result


# What a client waits before sending an upload refused for its tenant's queued bytes again.
QUEUE_FULL_RETRY_AFTER_S = 30


def admit_to_queue(session: Session, upload: Upload, settings: Settings) -> None:
    """Refuse (429, Retry-After) an upload that would take its tenant's queued raw bytes past
    ``ingest_tenant_queued_bytes``: a tenant that uploads faster than it is indexed waits at
    the door, with nothing lost, instead of growing a backlog every other tenant's uploads
    are scheduled beside. A tenant with nothing queued is always admitted (one upload larger
    than the budget is bounded by the upload size limit instead)."""
    limit = settings.ingest_tenant_queued_bytes
    if not limit:
        return
    queued = jobs_repo.queued_bytes(session, upload.tenant_id)
    if queued and queued + len(upload.raw) > limit:
        raise TooManyRequests(
            f"this tenant has {queued} bytes queued for indexing, and this upload would take "
            f"it past {limit} (CONCORD_INGEST_TENANT_QUEUED_BYTES); nothing was accepted: "
            f"send it again in {QUEUE_FULL_RETRY_AFTER_S} s",
            retry_after=QUEUE_FULL_RETRY_AFTER_S,
        )


def accept_uploads(
    uow: UnitOfWork, settings: Settings, uploads: list[Upload]
) -> list[UploadResult]:
    """:func:`accept_upload` for many uploads in one transaction, set-wise (one statement
    each for the tenants, the locks, the documents, the versions and the jobs), in the order
    given: two uploads of one external id become two versions, or one if the second is
    unchanged. Publishing the jobs is left to the caller."""
    session = uow.session
    request_id = current_request_id()
    tenants_repo.ensure_tenants(session, [u.tenant_id for u in uploads])
    # Held until commit. lock_keys takes them in sorted order, so two such batches cannot
    # deadlock.
    lock_keys(session, [f"external:{u.tenant_id}:{u.external_id}" for u in uploads])
    # Locked as well: a delete of one of these documents (which locks its row, not the key)
    # either commits before this read, and the upload follows its tombstone, or waits for us.
    docs = repo.documents_by_external_ids(
        session, [(u.tenant_id, u.external_id) for u in uploads], for_update=True
    )
    current_time = now(session)
    republish_after = timedelta(seconds=settings.queued_republish_seconds)
    newest_jobs = jobs_repo.latest_jobs_for(session, [(d.id, d.version) for d in docs.values()])
    results: list[UploadResult] = []
    versions: list[dict[str, Any]] = []
    jobs: list[dict[str, Any]] = []

    def new_job(doc: Document) -> uuid.UUID:
        row = _job_row(doc, current_time + republish_after, request_id)
        jobs.append(row)
        job_id: uuid.UUID = row["id"]
        newest_jobs[(doc.id, doc.version)] = (job_id, JobState.QUEUED.value)
        return job_id

    for upload in uploads:
        digest = content_hash(upload)
        doc = docs.get((upload.tenant_id, upload.external_id))
        if doc is not None and not doc.deleted and doc.content_hash == digest:
            newest = newest_jobs.get((doc.id, doc.version))
            if newest is None or newest[1] not in (JobState.FAILED, JobState.DEAD_LETTERED):
                # Its job is filled in below: from this batch, or the version's newest one.
                results.append(UploadResult(doc.id, doc.version, None, "unchanged"))
                continue
            # The same content again after its job failed: a retry of that version.
            results.append(UploadResult(doc.id, doc.version, new_job(doc), "accepted"))
            continue
        doc = _next_version(session, doc, upload, digest, current_time)
        docs[(upload.tenant_id, upload.external_id)] = doc
        versions.append(_version_row(doc, upload, digest))
        results.append(UploadResult(doc.id, doc.version, new_job(doc), "accepted"))
    session.flush()  # the documents, before the rows that reference them
    insert_rows(session, DocumentVersion, versions)
    insert_rows(session, IngestJob, jobs)
    # Unchanged uploads answer with their version's newest job.
    return [
        replace(r, job_id=newest_jobs.get((r.document_id, r.version), (None, ""))[0])
        if r.status == "unchanged"
        else r
        for r in results
    ]


def _next_version(
    session: Session, doc: Document | None, upload: Upload, digest: str, current_time: datetime
) -> Document:
    """The upload's document at its new version: added at version 1, or its next version."""
    if doc is None:
        doc = Document(
            id=uuid.uuid4(),
            tenant_id=upload.tenant_id,
            external_id=upload.external_id,
            title=upload.title,
            metadata_=upload.metadata or {},
            version=1,
            content_hash=digest,
            deleted=False,
        )
        repo.add_document(session, doc)
        return doc
    doc.version += 1
    doc.title = upload.title
    doc.metadata_ = upload.metadata or {}
    doc.content_hash = digest
    doc.deleted = False
    doc.updated_at = current_time
    return doc


def _version_row(doc: Document, upload: Upload, digest: str) -> dict[str, Any]:
    return {
        "document_id": doc.id,
        "version": doc.version,
        "tenant_id": upload.tenant_id,
        "content_hash": digest,
        "content_type": upload.content_type,
        "filename": upload.filename,
        "raw": upload.raw,
        "tombstone": False,
    }


def _job_row(doc: Document, republish_at: datetime, request_id: str | None) -> dict[str, Any]:
    """A queued ingest job of the document's version. If its message never reaches a
    worker, the sweep publishes it again after ``republish_at`` (the database clock)."""
    return {
        "id": uuid.uuid4(),
        "tenant_id": doc.tenant_id,
        "document_id": doc.id,
        "version": doc.version,
        "state": JobState.QUEUED.value,
        "attempts": 0,
        "lease_expires_at": republish_at,
        "stage_timings": {},
        "detail": {"request_id": request_id} if request_id else {},
    }


# What a dead letter keeps of a refused event: the producer's mistake must be visible, but
# the letter is written for any event at all, so its size and depth are bounded here.
LETTER_MAX_DEPTH = 16
LETTER_MAX_STRING = 1000
LETTER_MAX_ITEMS = 100
LETTER_MAX_REF = 512  # an external id's own limit


def add_event_dead_letter(session: Session, event: dict[str, Any], error: Exception) -> None:
    """Record an upload event that can never be accepted as a dead letter (without its
    content, which may be large), so the producer's mistake is visible."""
    jobs_repo.add_dead_letter(
        session,
        tenant_id=storable_text(str(event.get("tenant_id") or "?"))[:64],
        source="event",
        ref=storable_text(str(event.get("external_id") or "?")[:LETTER_MAX_REF]),
        stage="intake",
        error_class=type(error).__name__,
        # a database error's primary message only: not its statement and parameters
        message=describe_error(error),
        attempts=1,
        payload={
            **_letter_value({k: v for k, v in event.items() if k != "content_base64"}),
            # A refusal of the content itself (4xx), not an outage that used up the retries:
            # only then is the same content not worth sending again.
            **(
                _refused_content_digest(event)
                if isinstance(error, ConcordError) and error.status_code < 500
                else {}
            ),
        },
    )


def _refused_content_digest(event: dict[str, Any]) -> dict[str, str]:
    """The SHA-256 of an inline content that was refused, so that ``concord sync`` does not
    send the same bytes again (shared/documents/sync.py); nothing where there is none."""
    content = event.get("content_base64")
    if not isinstance(content, str):
        return {}
    try:
        raw = base64.b64decode(content, validate=True)
    except binascii.Error:
        return {}
    return {"content_sha256": hashlib.sha256(raw).hexdigest()}


def _letter_value(value: Any, depth: int = 0) -> Any:
    """What a dead letter keeps of one value of a refused event: what Postgres cannot store
    (NUL, lone surrogates, NaN and infinities; see refuse_unstorable) made storable, long
    strings and lists cut, and nesting below ``LETTER_MAX_DEPTH`` summarised (an event nested
    hundreds deep must be recordable too, without recursing that deep)."""
    if isinstance(value, str):
        cut = value[:LETTER_MAX_STRING]
        return storable_text(cut) + ("…" if len(value) > LETTER_MAX_STRING else "")
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict | list) and depth >= LETTER_MAX_DEPTH:
        return f"({type(value).__name__} nested deeper than {LETTER_MAX_DEPTH} levels)"
    if isinstance(value, dict):
        items = list(value.items())[:LETTER_MAX_ITEMS]
        return {_letter_value(str(k)): _letter_value(v, depth + 1) for k, v in items}
    if isinstance(value, list):
        return [_letter_value(v, depth + 1) for v in value[:LETTER_MAX_ITEMS]]
    return value


def delete_document(
    uow: UnitOfWork,
    vectors: VectorWriter,
    tenant_id: str,
    document_id: uuid.UUID,
    *,
    queue: TaskQueue,
) -> int:
    """Record a tombstone as a new version, remove the chunks from Postgres and queue their
    deletion from Elasticsearch in the same transaction. Returns the tombstone version."""
    session = uow.session
    # The document's key before its row, in the order the ingest worker takes them (its write
    # holds the key, then needs the row for its chunks' foreign keys): the other order
    # deadlocked against a worker writing the same document's previous version.
    lock_key(session, f"document:{document_id}")
    doc = repo.document_for_tenant(session, tenant_id, document_id, for_update=True)
    if doc is None or doc.deleted:
        raise NotFound(f"document {document_id} not found")
    doc.version += 1
    doc.deleted = True
    doc.updated_at = now(session)
    repo.add_version(
        session,
        DocumentVersion(
            document_id=doc.id,
            version=doc.version,
            tenant_id=tenant_id,
            content_hash=doc.content_hash,
            content_type="tombstone",
            raw=None,
            tombstone=True,
        ),
    )
    removed = vectors.delete_superseded({doc.id: doc.version}).get(doc.id, [])
    outbox_repo.add_outbox(
        session,
        tenant_id=tenant_id,
        document_id=doc.id,
        op=OutboxOp.DELETE,
        version=doc.version,
        chunk_ids=removed,
    )
    uow.after_commit(queue.publish_relay)
    return doc.version


def delete_by_external_id(
    uow: UnitOfWork, vectors: VectorWriter, tenant_id: str, external_id: str, *, queue: TaskQueue
) -> bool:
    """Delete the tenant's live document of that external id (a delete event); False when
    there is none, so that replaying a delete is a no-op."""
    # The key an upload of the same document takes: serialized with uploads, the external id
    # names the same document until commit. Its row is locked by delete_document, after the
    # document's own key (locked here first, the row before the key deadlocked against an
    # ingest worker writing the document: it holds the key and waits for the row).
    lock_key(uow.session, f"external:{tenant_id}:{external_id}")
    found = repo.documents_by_external_ids(uow.session, [(tenant_id, external_id)])
    doc = found.get((tenant_id, external_id))
    if doc is None or doc.deleted:
        return False
    delete_document(uow, vectors, tenant_id, doc.id, queue=queue)
    return True


def get_document(
    session: Session, tenant_id: str, document_id: uuid.UUID, include_deleted: bool = False
) -> Document:
    """A deleted document is gone for callers (404), unless they ask for its tombstone."""
    doc = repo.document_for_tenant(session, tenant_id, document_id)
    if doc is None or (doc.deleted and not include_deleted):
        raise NotFound(f"document {document_id} not found")
    return doc
