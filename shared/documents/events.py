"""The upload event: the JSON message producers publish to the ``ingest`` queue.

Schema (the JSON Schema is docs/upload-event.schema.json)::

    {
      "schema": "concord.upload/v1",
      "action": "upsert",                 # optional: "upsert" (the default) or "delete"
      "tenant_id": "acme",                # required
      "external_id": "handbook.md",       # required: the producer's stable id
      "content_base64": "...",            # the raw bytes, or instead:
      "content_path": "ops/handbook.md",  # a file under CONCORD_INGEST_CONTENT_ROOT
      "content_type": "text/markdown",    # optional: sniffed/derived when absent
      "filename": "handbook.md",          # optional
      "title": "Handbook",                # optional
      "metadata": {"team": "ops"}         # optional: flat JSON object
    }

An upsert carries exactly one of ``content_base64`` and ``content_path``. Content by reference
is read by the worker from a directory that producers and workers share: the path is relative
to the tenant's own directory there (``<root>/<tenant_id>/``), so one tenant's event cannot
name another's files; no absolute path, no ``.`` or ``..``, no link followed; the file gets the
same size and screening checks as inline content. A delete event names only the document
(``tenant_id``, ``external_id``): its live version becomes a tombstone, as ``DELETE
/v1/documents/{id}`` does; deleting a document that does not exist (or no longer does) is a
no-op. A delete carries no version: it removes whatever is live when it is applied, so a
producer replaying events must replay them in order.

One event per message goes to ``concord.ingest.accept_upload_event``; a list of them in one
message to ``concord.ingest.accept_upload_events`` (what ``concord ingest`` and ``concord
sync`` send, in groups of :data:`EVENTS_PER_MESSAGE` or :data:`BYTES_PER_MESSAGE`): those
are accepted in one transaction, in order, and their jobs published as one batch. A longer
list (another producer's) is accepted in order, that many events to a transaction.
"""

from __future__ import annotations

import base64
import binascii
import errno
import functools
import itertools
import os
import stat
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from shared.db import UnitOfWork
from shared.db.repository import lock_keys
from shared.documents.intake import check_upload, check_upload_fields
from shared.documents.repository import documents_by_external_ids
from shared.documents.schemas import Upload
from shared.documents.service import accept_uploads, add_event_dead_letter, delete_by_external_id
from shared.errors import BadRequest, ConcordError, NotFound, PayloadTooLarge
from shared.parsing import resolve_content_type
from shared.settings import Settings
from shared.stores.compose import Stores
from shared.tenants.service import validate_tenant_id

SCHEMA_ID = "concord.upload/v1"
UPSERT_FIELDS = frozenset(
    {
        "schema", "action", "tenant_id", "external_id", "content_base64", "content_path",
        "content_type", "filename", "title", "metadata",
    }
)  # fmt: skip
EVENTS_PER_MESSAGE = 32
BYTES_PER_MESSAGE = 4 * 1024 * 1024  # of base64 content; a bigger single event goes alone


def build_upload_event(
    *,
    tenant_id: str,
    external_id: str,
    raw: bytes | None = None,
    content_path: str | None = None,
    content_type: str | None = None,
    filename: str | None = None,
    title: str = "",
    metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An upsert event with the content inline (``raw``) or by reference (``content_path``)."""
    content = (
        {"content_path": content_path}
        if content_path is not None
        else {"content_base64": base64.b64encode(raw or b"").decode()}
    )
    return {
        "schema": SCHEMA_ID,
        "tenant_id": tenant_id,
        "external_id": external_id,
        **content,
        "content_type": content_type,
        "filename": filename,
        "title": title,
        "metadata": metadata or {},
    }


def build_delete_event(*, tenant_id: str, external_id: str) -> dict[str, Any]:
    return {
        "schema": SCHEMA_ID,
        "action": "delete",
        "tenant_id": tenant_id,
        "external_id": external_id,
    }


@dataclass(frozen=True)
class Deletion:
    """What a delete event asks for."""

    tenant_id: str
    external_id: str


def parse_event(event: dict[str, Any], settings: Settings) -> Upload | Deletion:
    """The upload or deletion an event describes; a ConcordError with a 4xx status says why
    it is not one."""
    action = event.get("action", "upsert")
    if action not in ("upsert", "delete"):
        raise BadRequest(f"upload event action {action!r} is neither 'upsert' nor 'delete'")
    if action == "upsert":
        return parse_upload_event(event, settings)
    _check_schema_and_ids(event)
    extra = sorted(set(event) - {"schema", "action", "tenant_id", "external_id"})
    if extra:
        raise BadRequest(f"a delete event names only the document; unexpected {extra}")
    validate_tenant_id(event["tenant_id"])
    check_upload_fields(event["external_id"], "", {})  # the same rules as an upload's id
    return Deletion(event["tenant_id"], event["external_id"])


def _check_schema_and_ids(event: dict[str, Any]) -> None:
    if event.get("schema") != SCHEMA_ID:
        raise BadRequest(f"unknown upload event schema {event.get('schema')!r}")
    for key in ("tenant_id", "external_id"):
        if not isinstance(event.get(key), str) or not event[key]:
            raise BadRequest(f"upload event field {key!r} is required")


def read_referenced_content(path: Any, tenant_id: str, settings: Settings) -> bytes:
    """The bytes of ``path`` under the tenant's own directory of the content root
    (``<root>/<tenant_id>/<path>``), refusing anything that is not a regular file reached
    without following a link, or that is larger than an upload may be.

    The path is walked one component at a time from an open directory, each opened with
    O_NOFOLLOW, and the file is checked on its open descriptor: a component swapped for a link
    after a check cannot lead the read out of the tenant's directory, and a FIFO put in place
    of the file cannot block the worker (O_NONBLOCK, then refused as not a regular file)."""
    root_setting = settings.ingest_content_root
    if not root_setting:
        raise BadRequest(
            "content by reference is off: set CONCORD_INGEST_CONTENT_ROOT to the directory "
            "producers and workers share"
        )
    if not isinstance(path, str) or not path or "\x00" in path:
        raise BadRequest("content_path must be a non-empty string")
    relative = PurePosixPath(path)
    if relative.is_absolute() or any(part in ("..", ".") for part in relative.parts):
        raise BadRequest(f"content_path {path!r} must be relative, without '.' or '..'")
    directories = (tenant_id, *relative.parts[:-1])
    opened: list[int] = []
    try:
        opened.append(os.open(root_setting, os.O_RDONLY | os.O_DIRECTORY))
        for part in directories:
            flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
            opened.append(os.open(part, flags, dir_fd=opened[-1]))
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
        opened.append(os.open(relative.parts[-1], flags, dir_fd=opened[-1]))
        status = os.fstat(opened[-1])
        if not stat.S_ISREG(status.st_mode):
            raise BadRequest(f"content_path {path!r} is not a regular file")
        if status.st_size > settings.max_upload_bytes:
            raise PayloadTooLarge(
                f"content_path {path!r} holds {status.st_size} bytes; the limit is "
                f"{settings.max_upload_bytes}"
            )
        raw = _read_up_to(opened[-1], settings.max_upload_bytes + 1)
    except FileNotFoundError as e:
        raise NotFound(f"content_path {path!r} does not exist in the tenant's directory") from e
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
            raise BadRequest(
                f"content_path {path!r} passes through a link or a non-directory: links are "
                "not followed under the content root"
            ) from e
        raise BadRequest(f"content_path {path!r} cannot be read: {e.strerror}") from e
    finally:
        for fd in reversed(opened):
            os.close(fd)
    if len(raw) > settings.max_upload_bytes:  # it grew after fstat
        raise PayloadTooLarge(f"content_path {path!r} is over {settings.max_upload_bytes} bytes")
    return raw


def _read_up_to(fd: int, limit: int) -> bytes:
    parts, size = [], 0
    while size < limit:
        piece = os.read(fd, min(1 << 20, limit - size))
        if not piece:
            break
        parts.append(piece)
        size += len(piece)
    return b"".join(parts)


def parse_upload_event(event: dict[str, Any], settings: Settings) -> Upload:
    """The upload an event describes, through the same intake check as the API's uploads
    (shared/documents/intake.py); a ConcordError with a 4xx status says why not."""
    _check_schema_and_ids(event)
    unknown = sorted(set(event) - UPSERT_FIELDS)
    if unknown:
        raise BadRequest(f"unknown upload event fields {unknown} (see the JSON Schema)")
    inline, reference = "content_base64" in event, "content_path" in event
    if inline == reference:
        raise BadRequest("an upsert event carries exactly one of content_base64 and content_path")
    validate_tenant_id(event["tenant_id"])
    if reference:
        raw = read_referenced_content(event["content_path"], event["tenant_id"], settings)
    else:
        # Empty content is accepted here: its job then fails at parsing with a reason to show.
        if not isinstance(event.get("content_base64"), str):
            raise BadRequest("upload event field 'content_base64' must be a string")
        try:
            raw = base64.b64decode(event["content_base64"], validate=True)
        except binascii.Error as e:
            raise BadRequest(f"content_base64 is not valid base64: {e}") from e
    metadata = event.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise BadRequest("metadata must be a JSON object")
    title = event.get("title") or ""
    for key in ("title", "filename", "content_type"):
        if not isinstance(event.get(key) or "", str):
            raise BadRequest(f"upload event field {key!r} must be a string")
    upload = Upload(
        tenant_id=event["tenant_id"],
        external_id=event["external_id"],
        raw=raw,
        content_type=resolve_content_type(event.get("content_type"), event.get("filename"), raw),
        title=title,
        filename=event.get("filename"),
        metadata=metadata,
    )
    check_upload(upload, settings)
    return upload


@dataclass
class EventsOutcome:
    accepted: int = 0
    unchanged: int = 0  # an unchanged upsert, or a delete of a document that is not there
    rejected: int = 0
    deleted: int = 0
    job_ids: list[uuid.UUID] = field(default_factory=list)

    def add(self, other: EventsOutcome) -> None:
        self.accepted += other.accepted
        self.unchanged += other.unchanged
        self.rejected += other.rejected
        self.deleted += other.deleted
        self.job_ids += other.job_ids

    def counts(self) -> dict[str, int]:
        return {
            "accepted": self.accepted,
            "unchanged": self.unchanged,
            "rejected": self.rejected,
            "deleted": self.deleted,
        }


def accept_upload_events(
    stores: Stores, uow: UnitOfWork, events: list[Any], settings: Settings
) -> EventsOutcome:
    """Accept a message's events in the caller's transaction; each one that can never be
    accepted is dead-lettered in the same transaction, with its reason. The accepted jobs are
    published after commit in batches of ``ingest_batch_jobs``, one message each."""
    outcome = EventsOutcome()
    parsed: list[Upload | Deletion] = []
    for event in events:
        if not isinstance(event, dict):
            event = {"event": repr(event)[:200]}
        try:
            parsed.append(parse_event(event, settings))
        except ConcordError as e:
            if e.status_code >= 500:
                raise
            add_event_dead_letter(uow.session, event, e)
            outcome.rejected += 1
    # Every document's key first, in sorted order (as accept_uploads takes them; they are
    # re-entrant): two messages touching the same documents wait for each other here,
    # before either holds a row lock, and cannot deadlock.
    if parsed:
        lock_keys(uow.session, [f"external:{p.tenant_id}:{p.external_id}" for p in parsed])
        # And the document key of each document a delete names, before an upload earlier in
        # the message locks its row: the ingest worker holds that key while it waits for the
        # row (a delete after an upload of another document in one slice deadlocked with the
        # worker writing the deleted one, and the slice's events went on in another message).
        named = [(d.tenant_id, d.external_id) for d in parsed if isinstance(d, Deletion)]
        existing = documents_by_external_ids(uow.session, named)
        if existing:  # most messages delete nothing: no round trip for them
            lock_keys(uow.session, [f"document:{d.id}" for d in existing.values()])
    # In the message's order: consecutive uploads are accepted together, each delete between
    # them in its turn (an upload after a delete of the same document revives it).
    for is_deletion, run in itertools.groupby(parsed, key=lambda p: isinstance(p, Deletion)):
        items = list(run)
        if is_deletion:
            for deletion in (d for d in items if isinstance(d, Deletion)):
                vectors = stores.vectors(uow.session)
                tenant_id, external_id = deletion.tenant_id, deletion.external_id
                if delete_by_external_id(uow, vectors, tenant_id, external_id, queue=stores.queue):
                    outcome.deleted += 1
                else:
                    outcome.unchanged += 1
            continue
        uploads = [u for u in items if isinstance(u, Upload)]
        for result in accept_uploads(uow, settings, uploads):
            if result.status == "accepted" and result.job_id is not None:
                outcome.accepted += 1
                outcome.job_ids.append(result.job_id)
            else:
                outcome.unchanged += 1
    size = max(settings.ingest_batch_jobs, 1)
    for start in range(0, len(outcome.job_ids), size):
        batch = outcome.job_ids[start : start + size]
        uow.after_commit(functools.partial(stores.queue.publish_ingest_jobs, batch))
    return outcome


class EventBatcher:
    """Groups upload events into messages of at most :data:`EVENTS_PER_MESSAGE` events and
    :data:`BYTES_PER_MESSAGE` of content; ``publish`` sends one message. Call :meth:`flush`
    at the end."""

    def __init__(self, publish: Callable[[list[dict[str, Any]]], None]) -> None:
        self.publish = publish
        self.pending: list[dict[str, Any]] = []
        self.pending_bytes = 0

    def add(self, event: dict[str, Any]) -> int:
        """Queue ``event``; returns how many events this call published."""
        size = len(event.get("content_base64") or "")
        published = 0
        if self.pending and self.pending_bytes + size > BYTES_PER_MESSAGE:
            published = self.flush()
        self.pending.append(event)
        self.pending_bytes += size
        if len(self.pending) >= EVENTS_PER_MESSAGE:
            published += self.flush()
        return published

    def flush(self) -> int:
        events, self.pending, self.pending_bytes = self.pending, [], 0
        if events:
            self.publish(events)
        return len(events)
