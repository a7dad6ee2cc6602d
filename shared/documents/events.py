"""The upload event: the JSON message producers publish to the ``ingest`` queue.

Schema (the JSON Schema is docs/upload-event.schema.json)::

    {
      "schema": "concord.upload/v1",
      "tenant_id": "acme",                # required
      "external_id": "handbook.md",       # required: the producer's stable id
      "content_base64": "...",            # required: the raw bytes
      "content_type": "text/markdown",    # optional: sniffed/derived when absent
      "filename": "handbook.md",          # optional
      "title": "Handbook",                # optional
      "metadata": {"team": "ops"}         # optional: flat JSON object
    }

One event per message goes to ``concord.ingest.accept_upload_event``; a list of them in one
message to ``concord.ingest.accept_upload_events`` (what ``concord ingest`` sends, in groups of
:data:`EVENTS_PER_MESSAGE` or :data:`BYTES_PER_MESSAGE`): those are accepted in one transaction
and their jobs published as one batch.
"""

from __future__ import annotations

import base64
import binascii
import functools
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shared.db import UnitOfWork
from shared.documents.intake import check_upload
from shared.documents.schemas import Upload
from shared.documents.service import accept_uploads, add_event_dead_letter
from shared.errors import BadRequest, ConcordError
from shared.ingest.parsing import resolve_content_type
from shared.queue import publish_ingest_jobs
from shared.settings import Settings
from shared.tenants.service import validate_tenant_id

SCHEMA_ID = "concord.upload/v1"
EVENTS_PER_MESSAGE = 32
BYTES_PER_MESSAGE = 4 * 1024 * 1024  # of base64 content; a bigger single event goes alone


def build_upload_event(
    *,
    tenant_id: str,
    external_id: str,
    raw: bytes,
    content_type: str | None = None,
    filename: str | None = None,
    title: str = "",
    metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "schema": SCHEMA_ID,
        "tenant_id": tenant_id,
        "external_id": external_id,
        "content_base64": base64.b64encode(raw).decode(),
        "content_type": content_type,
        "filename": filename,
        "title": title,
        "metadata": metadata or {},
    }


def parse_upload_event(event: dict[str, Any], settings: Settings) -> Upload:
    """The upload an event describes, through the same intake check as the API's uploads
    (shared/documents/intake.py); a ConcordError with a 4xx status says why not."""
    if event.get("schema") != SCHEMA_ID:
        raise BadRequest(f"unknown upload event schema {event.get('schema')!r}")
    for key in ("tenant_id", "external_id"):
        if not isinstance(event.get(key), str) or not event[key]:
            raise BadRequest(f"upload event field {key!r} is required")
    # Empty content is accepted here: its job then fails at parsing with a reason to show.
    if not isinstance(event.get("content_base64"), str):
        raise BadRequest("upload event field 'content_base64' is required")
    try:
        raw = base64.b64decode(event["content_base64"], validate=True)
    except binascii.Error as e:
        raise BadRequest(f"content_base64 is not valid base64: {e}") from e
    validate_tenant_id(event["tenant_id"])
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
    unchanged: int = 0
    rejected: int = 0
    job_ids: list[uuid.UUID] = field(default_factory=list)

    def add(self, other: EventsOutcome) -> None:
        self.accepted += other.accepted
        self.unchanged += other.unchanged
        self.rejected += other.rejected
        self.job_ids += other.job_ids

    def counts(self) -> dict[str, int]:
        return {"accepted": self.accepted, "unchanged": self.unchanged, "rejected": self.rejected}


def accept_upload_events(uow: UnitOfWork, events: list[Any], settings: Settings) -> EventsOutcome:
    """Accept a message's events in the caller's transaction; each one that can never be
    accepted is dead-lettered in the same transaction, with its reason. The accepted jobs are
    published after commit in batches of ``ingest_batch_jobs``, one message each."""
    outcome = EventsOutcome()
    uploads = []
    for event in events:
        if not isinstance(event, dict):
            event = {"event": repr(event)[:200]}
        try:
            uploads.append(parse_upload_event(event, settings))
        except ConcordError as e:
            if e.status_code >= 500:
                raise
            add_event_dead_letter(uow.session, event, e)
            outcome.rejected += 1
    for result in accept_uploads(uow, settings, uploads):
        if result.status == "accepted" and result.job_id is not None:
            outcome.accepted += 1
            outcome.job_ids.append(result.job_id)
        else:
            outcome.unchanged += 1
    size = max(settings.ingest_batch_jobs, 1)
    for start in range(0, len(outcome.job_ids), size):
        batch = outcome.job_ids[start : start + size]
        uow.after_commit(functools.partial(publish_ingest_jobs, batch))
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
