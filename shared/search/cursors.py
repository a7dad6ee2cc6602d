"""Cursor pagination beyond ``top_k``: the first page's ranking is kept, so later pages follow
it whatever is written meanwhile.

A search with ``paginate: true`` stores its retrieval (both arms' hits, the fused ranking, the
query vector and the resolved request) in Redis (shared/stores/snapshots.py) for
``search_cursor_ttl_s`` under a random id, and returns an opaque cursor: that id and where the
next page starts. ``POST /v1/search/next`` reads the next page from the stored ranking,
hydrating it from Postgres then, so nothing stale or deleted is served (a chunk deleted since
is dropped) and nothing new shifts the pages (a document written since is not in this
ranking: a new search finds it). A cursor belongs to the tenant that made it: another
tenant's lookup finds nothing.

Redis is also the broker, so what cursors hold is bounded: a snapshot is stored compressed
(a deep request's is about 280 KB of JSON, 85 KB compressed) and may be at most
``MAX_SNAPSHOT_BYTES`` so (a search whose filters hold megabytes of incompressible values is
refused pagination), and a tenant keeps at most ``search_cursors_per_tenant`` live ones, the
oldest dropped first (its next page is then a 404, as for an expired one): at most 50 MiB a
tenant under the defaults. One tenant's paging cannot evict another's."""

from __future__ import annotations

import base64
import binascii
import json
import re
import secrets
import zlib
from typing import Any, NamedTuple

from shared.errors import BadRequest, NotFound, StoreUnavailable
from shared.search.coverage import CorpusCounts
from shared.search.schemas import SearchRequest
from shared.search.values import Retrieved
from shared.settings import Settings
from shared.stores.ports import SnapshotStore
from shared.stores.schemas import ArmHit

# What save() issues (secrets.token_urlsafe(16)); checked before any read, so no forged id
# can name another key under PREFIX (a tenant's cursor list, say).
_CURSOR_ID = re.compile(r"[A-Za-z0-9_-]{22}")
MAX_SNAPSHOT_BYTES = 256 * 1024


class Stored(NamedTuple):
    """What a cursor keeps of its first page's search: the request as it was resolved (its
    profile applied), the tenant's calibrated threshold it was decided with, its retrieval."""

    request: SearchRequest
    calibrated_min_score: float | None
    retrieved: Retrieved


def save(snapshots: SnapshotStore, tenant_id: str, stored_search: Stored) -> str:
    cursor_id = secrets.token_urlsafe(16)
    request, retrieved = stored_search.request, stored_search.retrieved
    snapshot = {
        "tenant": tenant_id,
        "request": request.model_dump(mode="json", by_alias=True, exclude_unset=True),
        # every page is decided as the first was, whatever calibration does meanwhile
        "calibrated_min_score": stored_search.calibrated_min_score,
        "arms": {
            a: [[h.chunk_id, h.rank, h.score] for h in hits] for a, hits in retrieved.arms.items()
        },
        "degraded": retrieved.degraded,
        "vector": retrieved.vector,
        "fused": retrieved.fused,
        "counts": None
        if retrieved.counts is None
        else [retrieved.counts.chunks, retrieved.counts.holding, retrieved.counts.known],
    }
    stored = zlib.compress(json.dumps(snapshot).encode(), 1)
    if len(stored) > MAX_SNAPSHOT_BYTES:
        raise BadRequest(
            f"this search is too large to paginate: its cursor would hold {len(stored)} bytes "
            f"compressed, the limit is {MAX_SNAPSHOT_BYTES} (shorten the filters' values or "
            "lower candidate_depth)"
        )
    try:
        snapshots.put(tenant_id, cursor_id, stored)
    except StoreUnavailable as e:
        raise StoreUnavailable(f"the cursor could not be stored ({e})") from e
    return cursor_id


def load(snapshots: SnapshotStore, settings: Settings, tenant_id: str, cursor_id: str) -> Stored:
    try:
        raw = snapshots.get(cursor_id)
    except StoreUnavailable as e:
        raise StoreUnavailable(f"the cursor could not be read ({e})") from e
    snapshot = _snapshot(raw) if raw else None
    if snapshot is None or snapshot["tenant"] != tenant_id:
        raise NotFound(
            f"no such cursor: it expired (cursors live {settings.search_cursor_ttl_s} s) "
            "or was never issued to this tenant"
        )
    retrieved = Retrieved(
        arms={a: [ArmHit(c, r, s) for c, r, s in hits] for a, hits in snapshot["arms"].items()},
        degraded=list(snapshot["degraded"]),
        vector=list(snapshot["vector"]),
        fused=[(c, s) for c, s in snapshot["fused"]],
        counts=CorpusCounts(*snapshot["counts"]) if snapshot.get("counts") else None,
    )
    request = SearchRequest.model_validate(snapshot["request"])
    return Stored(request, snapshot.get("calibrated_min_score"), retrieved)


def _snapshot(raw: bytes) -> dict[str, Any]:
    # A cursor saved before snapshots were compressed (for its TTL after an upgrade) is JSON.
    snapshot: dict[str, Any] = json.loads(raw if raw.startswith(b"{") else zlib.decompress(raw))
    return snapshot


def encode(cursor_id: str, offset: int) -> str:
    return base64.urlsafe_b64encode(f"{cursor_id}:{offset}".encode()).decode().rstrip("=")


def decode(cursor: str) -> tuple[str, int]:
    """The cursor's id and offset, or a 400 that says the cursor is not one of ours."""
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        cursor_id, offset = text.rsplit(":", 1)
        if not _CURSOR_ID.fullmatch(cursor_id) or not offset.isdigit() or len(offset) > 9:
            raise ValueError(text)
        return cursor_id, int(offset)
    except (ValueError, binascii.Error, UnicodeDecodeError) as e:
        raise BadRequest("malformed cursor: pass next_cursor from a search response as is") from e
