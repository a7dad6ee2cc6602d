"""Intake: accept an upload (or a delete) into Postgres. Nothing here commits or enqueues
directly: the caller's unit of work commits, and only then are tasks published."""

from __future__ import annotations

import hashlib
import json
import math
import uuid
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, Literal

from sqlalchemy.orm import Session

from shared.db import UnitOfWork, now, unit_of_work
from shared.errors import BadRequest, ConcordError, NotFound
from shared.ingest import repository as repo
from shared.logs import current_request_id
from shared.models import Document, DocumentVersion, IngestJob, JobState, OutboxOp
from shared.queue import publish_ingest_job, publish_relay
from shared.search.filters import parse_iso_date
from shared.search.schemas import ISO_DATE, METADATA_KEY
from shared.settings import Settings
from shared.tenants import repository as tenants_repo

# What the API's OpenAPI schema and docs/upload-event.schema.json publish, for every way in.
MAX_EXTERNAL_ID_CHARS = 512
MAX_TITLE_CHARS = 1000
# Metadata is copied into every chunk, in both stores: bounded per document.
MAX_METADATA_KEYS = 64
MAX_METADATA_BYTES = 16 * 1024  # as compact JSON
MAX_METADATA_LIST = 100  # values in one list
MAX_EXACT_INT = 2**53  # what a double (Elasticsearch's number) holds exactly


def check_upload_fields(external_id: str, title: str, metadata: dict[str, Any]) -> None:
    """Refuse an upload's names and metadata at the door, with the reason, whichever way it
    came in (JSON, multipart form or upload event; each has made sure there is an
    external_id)."""
    if len(external_id) > MAX_EXTERNAL_ID_CHARS:
        raise BadRequest(
            f"external_id is {len(external_id)} characters; the limit is {MAX_EXTERNAL_ID_CHARS}"
        )
    if len(title) > MAX_TITLE_CHARS:
        raise BadRequest(f"title is {len(title)} characters; the limit is {MAX_TITLE_CHARS}")
    refuse_unstorable(external_id, "external_id")
    refuse_unstorable(title, "title")
    refuse_unstorable(metadata, "metadata")
    check_metadata(metadata)


def check_metadata(metadata: dict[str, Any]) -> None:
    """A flat object: at most MAX_METADATA_KEYS keys named as filters name them, each value a
    string, number, boolean or null, or a list of those; a string that looks like a date must
    be a real one (it becomes a date range term). The error names the field at fault."""
    if len(metadata) > MAX_METADATA_KEYS:
        raise BadRequest(f"metadata has {len(metadata)} keys; the limit is {MAX_METADATA_KEYS}")
    for key, value in metadata.items():
        if not isinstance(key, str) or not METADATA_KEY.fullmatch(key):
            raise BadRequest(
                f"metadata key {key!r} is not allowed: 1-64 characters, letters, digits, "
                "'_', '-' and '.', not starting with '.' or '-'"
            )
        items = value if isinstance(value, list) else [value]
        if isinstance(value, list) and len(value) > MAX_METADATA_LIST:
            raise BadRequest(
                f"metadata.{key} holds {len(value)} values; the limit is {MAX_METADATA_LIST}"
            )
        for item in items:
            if item is not None and not isinstance(item, str | int | float | bool):
                raise BadRequest(
                    f"metadata.{key} must be a string, number, boolean or null, or a list of "
                    "those (metadata is a flat object)"
                )
            if isinstance(item, int) and not isinstance(item, bool) and abs(item) > MAX_EXACT_INT:
                raise BadRequest(
                    f"metadata.{key}: integers beyond ±2^53 are not kept exactly by both stores"
                )
            if isinstance(item, str) and ISO_DATE.match(item):
                try:
                    parse_iso_date(item)
                except ValueError as e:
                    raise BadRequest(f"metadata.{key}: {item!r} is not a valid date ({e})") from e
    size = len(json.dumps(metadata, separators=(",", ":"), ensure_ascii=False).encode())
    if size > MAX_METADATA_BYTES:
        raise BadRequest(
            f"metadata is {size} bytes as JSON; the limit is {MAX_METADATA_BYTES} (it is "
            "copied into every chunk)"
        )


def refuse_unstorable(value: Any, where: str) -> None:
    """Refuse at the door what Postgres would refuse at the insert: NUL characters and lone
    surrogates in text (text and JSONB), NaN and infinities in JSONB."""
    if isinstance(value, str):
        if "\x00" in value:
            raise BadRequest(f"{where} must not contain NUL characters")
        if not value.isascii() and not _encodes(value):
            raise BadRequest(f"{where} must be valid Unicode (it holds a lone surrogate)")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise BadRequest(f"{where} must not hold NaN or infinite numbers")
    elif isinstance(value, dict):
        for key, item in value.items():
            refuse_unstorable(key, where)
            refuse_unstorable(item, where)
    elif isinstance(value, list):
        for item in value:
            refuse_unstorable(item, where)


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@dataclass(frozen=True)
class Upload:
    tenant_id: str
    external_id: str
    raw: bytes
    content_type: str
    title: str = ""
    filename: str | None = None
    metadata: dict[str, Any] | None = None


@dataclass(frozen=True)
class UploadResult:
    document_id: uuid.UUID
    version: int
    job_id: uuid.UUID | None
    status: Literal["accepted", "unchanged"]


def content_hash(upload: Upload) -> str:
    """What makes two uploads the same: bytes, type, title and metadata."""
    digest = hashlib.sha256(upload.raw)
    digest.update(b"\0" + upload.content_type.encode())
    digest.update(b"\0" + upload.title.encode())
    digest.update(b"\0" + json.dumps(upload.metadata or {}, sort_keys=True).encode())
    return digest.hexdigest()


def accept_upload(
    uow: UnitOfWork, settings: Settings, upload: Upload, publish: bool = True
) -> UploadResult:
    """Commit the document, its raw content and a job; the job is published after commit
    (unless ``publish`` is False: the caller publishes the jobs it accepted together).

    Re-uploading unchanged content is a no-op that reports ``unchanged``; changed content
    becomes the next version."""
    result = accept_uploads(uow, settings, [upload])[0]
    if publish and result.status == "accepted" and result.job_id is not None:
        job_id = result.job_id
        uow.after_commit(lambda: publish_ingest_job(job_id))
    return result


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
    repo.lock_keys(session, [f"external:{u.tenant_id}:{u.external_id}" for u in uploads])
    # Locked as well: a delete of one of these documents (which locks its row, not the key)
    # either commits before this read, and the upload follows its tombstone, or waits for us.
    docs = repo.documents_by_external_ids(
        session, [(u.tenant_id, u.external_id) for u in uploads], for_update=True
    )
    current_time = now(session)
    republish_after = timedelta(seconds=settings.queued_republish_seconds)
    newest_jobs = repo.latest_jobs_for(session, [(d.id, d.version) for d in docs.values()])
    results: list[UploadResult] = []
    versions: list[dict[str, Any]] = []
    jobs: list[dict[str, Any]] = []

    def new_job(doc: Document) -> uuid.UUID:
        job_id = uuid.uuid4()
        jobs.append(
            {
                "id": job_id,
                "tenant_id": doc.tenant_id,
                "document_id": doc.id,
                "version": doc.version,
                "state": JobState.QUEUED.value,
                "attempts": 0,
                # If the message never reaches a worker, the sweep publishes it again
                # after this (the database clock: this transaction's now()).
                "lease_expires_at": current_time + republish_after,
                "stage_timings": {},
                "detail": {"request_id": request_id} if request_id else {},
            }
        )
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
            session.add(doc)
            docs[(upload.tenant_id, upload.external_id)] = doc
        else:
            doc.version += 1
            doc.title = upload.title
            doc.metadata_ = upload.metadata or {}
            doc.content_hash = digest
            doc.deleted = False
            doc.updated_at = current_time
        versions.append(
            {
                "document_id": doc.id,
                "version": doc.version,
                "tenant_id": upload.tenant_id,
                "content_hash": digest,
                "content_type": upload.content_type,
                "filename": upload.filename,
                "raw": upload.raw,
                "tombstone": False,
            }
        )
        results.append(UploadResult(doc.id, doc.version, new_job(doc), "accepted"))
    session.flush()  # the documents, before the rows that reference them
    repo.insert_rows(session, DocumentVersion, versions)
    repo.insert_rows(session, IngestJob, jobs)
    # Unchanged uploads answer with their version's newest job.
    return [
        replace(r, job_id=newest_jobs.get((r.document_id, r.version), (None, ""))[0])
        if r.status == "unchanged"
        else r
        for r in results
    ]


def reject_upload_event(event: dict[str, Any], error: Exception) -> None:
    """Record an upload event that can never be accepted as a dead letter (without its
    content, which may be large), so the producer's mistake is visible and replayable."""
    with unit_of_work() as uow:
        add_event_dead_letter(uow.session, event, error)


def add_event_dead_letter(session: Session, event: dict[str, Any], error: Exception) -> None:
    message = error.message if isinstance(error, ConcordError) else str(error)
    repo.add_dead_letter(
        session,
        tenant_id=_storable(str(event.get("tenant_id") or "?"))[:64],
        source="event",
        ref=_storable(str(event.get("external_id") or "?")),
        stage="intake",
        error_class=type(error).__name__,
        message=_storable(message),
        attempts=1,
        payload=_storable({k: v for k, v in event.items() if k != "content_base64"}),
    )


def _storable(value: Any) -> Any:
    """An event refused for holding what Postgres cannot store (see refuse_unstorable) must
    still be recorded: NUL characters are dropped, lone surrogates replaced, and NaN and
    infinities written as text."""
    if isinstance(value, str):
        return value.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {_storable(str(k)): _storable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_storable(v) for v in value]
    return value


def delete_document(uow: UnitOfWork, tenant_id: str, document_id: uuid.UUID) -> int:
    """Record a tombstone as a new version, remove the chunks from Postgres and queue their
    deletion from Elasticsearch in the same transaction. Returns the tombstone version."""
    session = uow.session
    doc = repo.document_for_tenant(session, tenant_id, document_id, for_update=True)
    if doc is None or doc.deleted:
        raise NotFound(f"document {document_id} not found")
    repo.lock_key(session, f"document:{doc.id}")
    doc.version += 1
    doc.deleted = True
    doc.updated_at = now(session)
    session.add(
        DocumentVersion(
            document_id=doc.id,
            version=doc.version,
            tenant_id=tenant_id,
            content_hash=doc.content_hash,
            content_type="tombstone",
            raw=None,
            tombstone=True,
        )
    )
    removed = repo.delete_chunks_older_than(session, doc.id, doc.version)
    repo.add_outbox(
        session,
        tenant_id=tenant_id,
        document_id=doc.id,
        op=OutboxOp.DELETE,
        version=doc.version,
        chunk_ids=removed,
    )
    uow.after_commit(publish_relay)
    return doc.version


def get_document(
    session: Session, tenant_id: str, document_id: uuid.UUID, include_deleted: bool = False
) -> Document:
    """A deleted document is gone for callers (404), unless they ask for its tombstone."""
    doc = repo.document_for_tenant(session, tenant_id, document_id)
    if doc is None or (doc.deleted and not include_deleted):
        raise NotFound(f"document {document_id} not found")
    return doc
