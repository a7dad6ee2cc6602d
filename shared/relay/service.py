"""The relay: drain the Elasticsearch outbox (shared/outbox, the table every write path
fills in its own transaction) into the chunk index with the bulk API, and queue the purge of
stale copies a search met.

Every item's result is read (a bulk 200 can hide item failures). Writes carry the Postgres
version as an external version, so duplicate, late or out-of-order deliveries cannot bring back
stale or deleted content: Elasticsearch answers 409 when it already holds an equal or newer
version, and that counts as done. 429 and 5xx are retried with backoff and jitter (and a few
answers a moment of the index layout explains: see ``_retriable``); anything else is
dead-lettered with its reason.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from shared.db import Transactions
from shared.documents import repository as documents_repo
from shared.errors import StoreError
from shared.jobs import repository as jobs_repo
from shared.models import Chunk, Document, EsOutbox, OutboxOp
from shared.outbox import repository as repo
from shared.retry import retry_delay
from shared.settings import Settings, get_settings
from shared.stores.chunk_document import es_document
from shared.stores.compose import Stores
from shared.stores.ports import ChunkWriter, VectorReads
from shared.stores.schemas import TenantLines

log = logging.getLogger(__name__)

RETRIABLE_STATUS = {429, 500, 502, 503, 504}
# Whole-request refusals a row can cause (too large, unparsable, a node failing on it): the
# request is split to find that row. Others (401, 403, 404...) concern every row alike.
SPLIT_STATUS = {400, 413} | RETRIABLE_STATUS


@dataclass
class RelayReport:
    claimed: int = 0  # outbox rows; several rows of one chunk are sent as one request
    sent: int = 0
    applied: int = 0
    already_current: int = 0
    retried: int = 0
    dead_lettered: int = 0
    unreachable: bool = False

    def add(self, other: RelayReport) -> None:
        for name in ("claimed", "sent", "applied", "already_current", "retried", "dead_lettered"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.unreachable = self.unreachable or other.unreachable


def backoff_seconds(attempts: int, cap: float = 60.0) -> float:
    """The relay's backoff: the project's jittered exponential one, from one second."""
    return retry_delay(attempts, base=1.0, cap=cap)


def drain(
    stores: Stores,
    transactions: Transactions,
    *,
    max_batches: int = 20,
    settings: Settings | None = None,
    deadline: float | None = None,
) -> RelayReport:
    """Relay up to ``max_batches`` batches of due rows, each claimed, sent and settled in a
    transaction of its own; stops early when the outbox has no more or Elasticsearch is
    unreachable. Stopped by ``max_batches`` or past ``deadline`` (``time.monotonic()``) with
    rows possibly left, it asks for the next drain: the request that started this one was
    cleared when it started, and those rows must not wait for beat."""
    settings = settings or get_settings()
    total = RelayReport()
    for _ in range(max_batches):
        with transactions() as uow:
            batch = _relay_batch(uow.session, settings, stores.index, stores.vectors(uow.session))
        total.add(batch)
        if batch.claimed < settings.relay_batch_size or batch.unreachable:
            break
        if deadline is not None and time.monotonic() >= deadline:
            stores.queue.publish_relay()
            break
    else:
        stores.queue.publish_relay()
    return total


def _relay_batch(
    session: Session, settings: Settings, index: ChunkWriter, vectors: VectorReads
) -> RelayReport:
    """claim → the newest operation per chunk → its bulk lines → send → settle each row."""
    report = RelayReport()
    rows = repo.claim_outbox(session, settings.relay_batch_size)
    report.claimed = len(rows)
    if not rows:
        return report
    newest, riders = _newest_per_chunk(rows)
    # Deletes too: each is checked against Postgres now, when it is applied.
    chunks = vectors.chunks_by_ids([cid for _, cid in newest])
    docs = documents_repo.documents_by_ids(session, [c.document_id for c in chunks.values()])
    requests = _actions(list(newest.values()), chunks, docs)
    report.sent = len(requests)
    try:
        results = _send(index, settings, requests)
    except StoreError as e:
        _postpone_batch(session, rows, e, report)
        return report
    done: list[int] = []
    for row, _ in requests:
        ids = riders[(row.tenant_id, row.chunk_id)]
        if _settle(session, settings, index, row, ids, results[row.id], report):
            done += ids
    # Rows of chunks with nothing to send (e.g. superseded) are finished too.
    sent = {(r.tenant_id, r.chunk_id) for r, _ in requests}
    done += [i for key, ids in riders.items() if key not in sent for i in ids]
    repo.delete_outbox(session, done)
    return report


def _newest_per_chunk(
    rows: Sequence[EsOutbox],
) -> tuple[dict[tuple[str, str], EsOutbox], dict[tuple[str, str], list[int]]]:
    """Only the newest operation per chunk (in a tenant's index) matters; older rows ride
    along with it: (tenant, chunk) -> the newest row, and -> every row's id."""
    newest: dict[tuple[str, str], EsOutbox] = {}
    riders: dict[tuple[str, str], list[int]] = {}
    for row in rows:
        key = (row.tenant_id, row.chunk_id)
        riders.setdefault(key, []).append(row.id)
        if key not in newest or _order(row) > _order(newest[key]):
            newest[key] = row
    return newest, riders


def _postpone_batch(
    session: Session, rows: Sequence[EsOutbox], error: StoreError, report: RelayReport
) -> None:
    """The bulk request failed as a whole: every row waits."""
    report.retried = len(rows)
    if error.status is None:
        # Elasticsearch is down: not the items' fault, so no attempt is counted. Groups
        # sent before the link went are sent again later (their versions make that a 409).
        report.unreachable = True
        delay = backoff_seconds(min(r.attempts for r in rows) + 1, cap=15.0)
        repo.postpone_outbox(session, [r.id for r in rows], delay, str(error), False)
    else:
        # Refused for a reason no row causes (authentication, a missing index): the
        # whole batch waits, its attempts counted, as before request splitting existed.
        repo.postpone_outbox(
            session,
            [r.id for r in rows],
            backoff_seconds(rows[0].attempts + 1),
            f"bulk request failed: {error}",
            count_attempt=True,
        )


def _settle(
    session: Session,
    settings: Settings,
    index: ChunkWriter,
    row: EsOutbox,
    ids: list[int],
    result: dict[str, Any],
    report: RelayReport,
) -> bool:
    """What one item's answer means for its rows: applied or already current (done), retried
    later, or dead-lettered (done). True when the rows are finished."""
    status = int(result.get("status", 500))
    if status < 300 or (status == 404 and row.op in DELETES):
        report.applied += 1
        return True
    if (
        status == 409
        and row.op == OutboxOp.REPAIR
        and not index.exists(row.tenant_id, row.chunk_id)
    ):
        # A tombstone newer than Postgres' version (an out-of-band delete) blocks the
        # repair until Elasticsearch forgets it (index.gc_deletes): try again later.
        report.retried += 1
        repo.postpone_outbox(
            session,
            ids,
            backoff_seconds(row.attempts + 1, cap=30.0),
            "blocked by a newer Elasticsearch tombstone",
            count_attempt=False,
        )
        return False
    if status == 409:
        report.already_current += 1
        return True
    if _retriable(row, status, result) and row.attempts + 1 < settings.relay_max_attempts:
        if status == 404:
            index.forget(row.tenant_id)  # prepared again with the next attempt
        report.retried += 1
        repo.postpone_outbox(
            session, ids, backoff_seconds(row.attempts + 1), _reason(result), count_attempt=True
        )
        return False
    report.dead_lettered += 1
    jobs_repo.add_dead_letter(
        session,
        tenant_id=row.tenant_id,
        source="outbox",
        ref=row.chunk_id,
        stage="es_relay",
        error_class=f"es_{status}",
        message=_reason(result),
        attempts=row.attempts + 1,
        payload={"op": row.op, "version": row.version, "document_id": str(row.document_id)},
    )
    return True


def _retriable(row: EsOutbox, status: int, result: dict[str, Any]) -> bool:
    """429 and 5xx; a write answered 404 (its tenant's index vanished under it); a write sent
    to the shared layout's alias just after a reindex moved every tenant to an index of its
    own (that alias takes no writes any more; the next attempt goes to the tenant's)."""
    if status in RETRIABLE_STATUS:
        return True
    if row.op in WRITES and status == 404:
        return True
    return status == 400 and "no write index" in _reason(result)


def _order(row: EsOutbox) -> tuple[int, int, int]:
    # At equal versions a delete outranks an index (a tombstone ends the version).
    return (row.version, 1 if row.op in DELETES else 0, row.id)


WRITES = (OutboxOp.INDEX, OutboxOp.REPAIR)
DELETES = (OutboxOp.DELETE, OutboxOp.PURGE)


def _version_type(op: str) -> str:
    # Repairs come from reconciliation, which reads Postgres, the source of truth: they may
    # overwrite a document at an equal version (a corrupted copy), never regress a newer one.
    return "external_gte" if op in (OutboxOp.REPAIR, OutboxOp.PURGE) else "external"


def _actions(
    rows: list[EsOutbox], chunks: dict[str, Chunk], docs: dict[Any, Document]
) -> list[tuple[EsOutbox, list[dict[str, Any]]]]:
    """Each row with the bulk lines (action, and document for a write) it sends."""
    requests: list[tuple[EsOutbox, list[dict[str, Any]]]] = []
    for row in rows:
        chunk = chunks.get(row.chunk_id)
        if row.op in WRITES and chunk is not None:
            # Always send the chunk as it is now; its version guards against regressions.
            requests.append((row, _index_lines(chunk, docs, _version_type(row.op))))
        elif (
            row.op in DELETES
            and chunk is not None
            and chunk.tenant_id == row.tenant_id
            and chunk.version >= row.version
        ):
            # Postgres holds a live copy at or above the delete's version: the delete was
            # decided on a view that a write overtook (a reconcile or a search that raced
            # it). The live copy is sent instead, so a delete never removes live data.
            # (A delete from another tenant's index, where a copy strayed, stays a delete.)
            requests.append((row, _index_lines(chunk, docs, "external_gte")))
        elif row.op in DELETES:
            action = {
                "_id": row.chunk_id,
                "version": row.version,
                "version_type": _version_type(row.op),
            }
            requests.append((row, [{"delete": action}]))
        # A write row whose chunk is gone was superseded by a delete row of its own.
    return requests


def _index_lines(
    chunk: Chunk, docs: dict[Any, Document], version_type: str
) -> list[dict[str, Any]]:
    action = {"_id": chunk.id, "version": chunk.version, "version_type": version_type}
    return [{"index": action}, es_document(chunk, docs[chunk.document_id])]


def _send(
    index: ChunkWriter,
    settings: Settings,
    requests: list[tuple[EsOutbox, list[dict[str, Any]]]],
) -> dict[int, dict[str, Any]]:
    """Send the rows' lines in bulk requests of at most ``relay_bulk_bytes`` each and return
    every row's item result by row id.

    Each row goes to its tenant's index, created first if the tenant has none: a tenant
    whose index cannot be created (the cluster's shard limit, say) gets that failure as the
    item result of each of its rows. A request refused as a whole (413 too large, 400
    unparsable, 5xx...) is split in halves and sent again, down to one row: the row that
    alone makes a request fail gets that failure as its own item result (attempts, backoff,
    then a dead letter), and the other rows of its batch are applied, never held with it."""
    results: dict[int, dict[str, Any]] = {}
    unavailable = index.prepare(row.tenant_id for row, _ in requests)
    for row, _ in requests:
        if row.tenant_id in unavailable:
            failure = unavailable[row.tenant_id]
            reason = {"type": "tenant_index_unavailable", "reason": failure.message[:500]}
            results[row.id] = {"status": failure.status, "error": reason}
    requests = [r for r in requests if r[0].tenant_id not in unavailable]

    def send(group: list[tuple[EsOutbox, list[dict[str, Any]]]]) -> None:
        lines = [(row.tenant_id, row_lines) for row, row_lines in group]
        try:
            response = index.bulk(lines)
        except StoreError as e:
            if e.status not in SPLIT_STATUS:
                raise
            if len(group) > 1:
                half = len(group) // 2
                send(group[:half])
                send(group[half:])
                return
            reason = {"type": "bulk_request_refused", "reason": str(e.message)[:500]}
            results[group[0][0].id] = {"status": e.status, "error": reason}
            return
        for (row, _), item in zip(group, response["items"], strict=True):
            results[row.id] = next(iter(item.values()))
        _dual_write(index, lines)

    for group in _groups_by_size(requests, settings.relay_bulk_bytes):
        send(group)
    return results


def _groups_by_size(
    requests: list[tuple[EsOutbox, list[dict[str, Any]]]], max_bytes: int
) -> list[list[tuple[EsOutbox, list[dict[str, Any]]]]]:
    """Consecutive groups whose serialized lines stay within ``max_bytes`` (a row larger than
    that goes alone)."""
    groups: list[list[tuple[EsOutbox, list[dict[str, Any]]]]] = []
    held = max_bytes + 1
    for request in requests:
        size = sum(len(json.dumps(line, ensure_ascii=False).encode()) + 1 for line in request[1])
        if held + size > max_bytes:
            groups.append([])
            held = 0
        groups[-1].append(request)
        held += size
    return groups


def _dual_write(index: ChunkWriter, lines: list[TenantLines]) -> None:
    """While a reindex builds the next generation of indices, every change goes there too.
    Failures there are not retried here: the reconcile that follows a reindex repairs them."""
    target = index.reindex_target() if lines else None
    if target is not None:
        try:
            index.bulk_to(target, lines)
        except StoreError as e:  # e.g. the reindex ended meanwhile (IndexUnavailable among them)
            if e.status is None:
                raise  # no answer: the batch waits for Elasticsearch, as the relay's own
            log.warning("dual write to %s failed (%s); reconcile repairs it", target, e)


def _reason(result: dict[str, Any]) -> str:
    error = result.get("error")
    if isinstance(error, dict):
        return f"{error.get('type')}: {error.get('reason')}"
    return str(error or result.get("result") or "unknown")
