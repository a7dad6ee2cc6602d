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
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from shared.auth import validate_tenant_id
from shared.errors import BadRequest
from shared.ingest.parsing import resolve_content_type
from shared.ingest.service import Upload

SCHEMA_ID = "concord.upload/v1"


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


def parse_upload_event(event: dict[str, Any]) -> Upload:
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
    return Upload(
        tenant_id=event["tenant_id"],
        external_id=event["external_id"],
        raw=raw,
        content_type=resolve_content_type(event.get("content_type"), event.get("filename"), raw),
        title=event.get("title") or "",
        filename=event.get("filename"),
        metadata=metadata,
    )
