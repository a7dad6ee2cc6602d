"""Deletes that cannot hit live data: a delete is checked against Postgres when
the relay applies it, and a stale-copy cleanup never blocks the write of a newer version."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from shared.db import unit_of_work
from shared.documents.service import delete_document
from shared.ingest import pipeline
from shared.models import DeadLetter, EsOutbox, OutboxOp
from shared.outbox import repository as outbox_repo
from shared.relay import service as relay
from shared.relay.purges import queue_stale_copy_purges
from shared.settings import get_settings
from shared.stores.compose import connect
from tests.conftest import CeleryProcess
from tests.helpers import (
    es_chunks,
    long_text,
    paused,
    pg_chunks,
    search,
    suite_queue,
    upload_text,
    wait_converged,
)


def test_a_purge_decided_before_a_write_landed_leaves_the_live_copy(
    client: TestClient, auth: dict[str, str], tenant: str, worker: CeleryProcess
) -> None:
    """Reconcile read Postgres before a chunk's commit and Elasticsearch after its relay, so
    it took the live copy for an orphan and queued a purge at the document's version."""
    upload = upload_text(client, auth, "race.txt", long_text("lapwing", 8))
    live = wait_converged(tenant)
    with paused(worker):
        with unit_of_work() as uow:
            for chunk_id, version in live.items():
                outbox_repo.add_outbox(
                    uow.session,
                    tenant_id=tenant,
                    document_id=uuid.UUID(upload["document_id"]),
                    op=OutboxOp.PURGE,
                    version=version,
                    chunk_ids=[chunk_id],
                )
        relay.drain(connect(), unit_of_work)
        assert es_chunks(tenant) == live == pg_chunks(tenant)


def test_a_stale_copy_cleanup_never_blocks_the_next_versions_write(
    client: TestClient, auth: dict[str, str], tenant: str, worker: CeleryProcess
) -> None:
    """Delete a document and upload it again within the relay lag; a search meets the old
    copy and queues its cleanup before the new version's write reaches Elasticsearch."""
    first = upload_text(client, auth, "phoenix.txt", "The ibis nests in reeds by the lake.")
    wait_converged(tenant)
    with paused(worker):
        deleted = client.delete(f"/v1/documents/{first['document_id']}", headers=auth)
        assert deleted.status_code == 200, deleted.text
        again = upload_text(client, auth, "phoenix.txt", "The ibis nests in reeds by the lake.")
        assert again["version"] == 3 and again["status"] == "accepted"
        # Elasticsearch still holds version 1; the search drops it and queues its cleanup.
        body = search(client, auth, "ibis nests", mode="lexical")
        assert body["results"] == [] and body["dropped_stale"] >= 1
        relay.drain(
            connect(), unit_of_work
        )  # the tombstone's deletes and the cleanup reach Elasticsearch first
        assert (
            pipeline.process_job(connect(), unit_of_work, uuid.UUID(again["job_id"])).state
            == "indexed"
        )
        relay.drain(connect(), unit_of_work)
        assert set(es_chunks(tenant).values()) == {3} == set(pg_chunks(tenant).values())
    hits = search(client, auth, "ibis nests", mode="lexical")["results"]
    assert [h["document_id"] for h in hits] == [first["document_id"]]


def test_a_hot_query_meeting_stale_copies_queues_each_purge_once(
    client: TestClient, auth: dict[str, str], tenant: str, worker: CeleryProcess
) -> None:
    """While the relay is behind (here: stopped), every search of a hot query meets the same
    stale copies; each queued its purge again, so the outbox the relay was behind grew by the
    query rate. Each copy's purge is queued once, and the relay then removes it."""
    upload_text(client, auth, "heron.txt", long_text("heron", 60))
    old = wait_converged(tenant)
    assert len(old) > 1
    with paused(worker):
        again = upload_text(client, auth, "heron.txt", "Herons stalk the shallows at dawn.")
        assert (
            pipeline.process_job(connect(), unit_of_work, uuid.UUID(again["job_id"])).state
            == "indexed"
        )
        stale = set(old) - set(pg_chunks(tenant))
        assert stale
        # A purge whose transaction rolls back is not taken for queued.
        with pytest.raises(RuntimeError), unit_of_work() as uow:
            queue_stale_copy_purges(connect(), uow, get_settings(), tenant, sorted(stale))
            raise RuntimeError("rolled back")
        dropped = [search(client, auth, "heron", mode="lexical")["dropped_stale"] for _ in range(6)]
        assert dropped[0] >= 1 and dropped == dropped[:1] * 6  # met by every search
        with unit_of_work() as uow:
            purges = uow.session.execute(
                select(EsOutbox.chunk_id, EsOutbox.version).where(
                    EsOutbox.tenant_id == tenant, EsOutbox.op == OutboxOp.PURGE
                )
            ).all()
        # Per stale copy: the new version's own purge of the chunks it no longer has (at 2),
        # and the first search's (at 1); none from the five searches after it.
        assert sorted(purges) == sorted([(c, 2) for c in stale] + [(c, 1) for c in stale])
        relay.drain(connect(), unit_of_work)
    assert es_chunks(tenant) == pg_chunks(tenant)
    assert search(client, auth, "heron", mode="lexical")["dropped_stale"] == 0


def test_an_upload_racing_a_delete_of_the_same_document_becomes_the_next_version(
    client: TestClient, auth: dict[str, str], tenant: str, worker: CeleryProcess
) -> None:
    """The delete holds the document row when the upload arrives; the upload must wait for it
    and then write the version after the tombstone, not collide with the tombstone's version
    (a duplicate key, answered 500)."""
    first = upload_text(client, auth, "racing.txt", "The first version of a racing document.")
    wait_converged(tenant)
    answers: list[Any] = []
    with unit_of_work() as uow:
        tombstone = delete_document(
            uow,
            connect().vectors(uow.session),
            tenant,
            uuid.UUID(first["document_id"]),
            queue=suite_queue(),
        )
        uploader = threading.Thread(
            target=lambda: answers.append(
                client.post(
                    "/v1/documents",
                    headers=auth,
                    json={"external_id": "racing.txt", "text": "The racing document, again."},
                )
            )
        )
        uploader.start()
        uploader.join(timeout=2)  # the upload is now waiting on the delete's transaction
        assert uploader.is_alive()
    uploader.join(timeout=30)
    [answer] = answers
    assert answer.status_code == 202, answer.text
    assert answer.json()["version"] == tombstone + 1
    live = wait_converged(tenant)
    assert set(live.values()) == {tombstone + 1}
    assert es_chunks(tenant) == pg_chunks(tenant)


def test_a_single_upload_event_refused_by_the_database_is_dead_lettered(
    tenant: str, worker: CeleryProcess
) -> None:
    """An event that passes the event checks but fails in the accepting transaction for a
    reason no retry fixes (here: a filename Postgres cannot store) must leave a dead letter,
    not vanish; a good event in its own message beside it is accepted."""
    from shared.documents.events import build_upload_event
    from shared.queue import publish_upload_event

    bad = build_upload_event(
        tenant_id=tenant, external_id="bad-filename", raw=b"fine text", filename="a\x00b.txt"
    )
    good = build_upload_event(tenant_id=tenant, external_id="good", raw=b"The good event.")
    publish_upload_event(bad)
    publish_upload_event(good)
    deadline = time.monotonic() + 60
    letters: list[DeadLetter] = []
    while time.monotonic() < deadline and not letters:
        with unit_of_work() as uow:
            letters = list(
                uow.session.scalars(
                    select(DeadLetter).where(
                        DeadLetter.tenant_id == tenant, DeadLetter.source == "event"
                    )
                )
            )
            uow.session.expunge_all()
        time.sleep(0.2)
    assert [letter.ref for letter in letters] == ["bad-filename"]
    assert letters[0].stage == "intake" and letters[0].message
    assert len(wait_converged(tenant)) == 1


def test_a_locking_read_sees_the_row_as_committed_since_the_session_read_it(tenant: str) -> None:
    """A delete event reads its document unlocked, waits for the document's key, then locks
    the row: it must lock the row as it is then (an API delete committed meanwhile), not the
    copy the session read before (a second tombstone of the same version failed on the
    versions' primary key)."""
    from shared.documents.events import accept_upload_events, build_upload_event
    from shared.documents.repository import document_for_tenant, documents_by_external_ids

    event = build_upload_event(tenant_id=tenant, external_id="x.txt", raw=b"Read, then gone.")
    with unit_of_work() as uow:
        accept_upload_events(connect(), uow, [event], get_settings())
    with unit_of_work() as reader:
        read = documents_by_external_ids(reader.session, [(tenant, "x.txt")])[(tenant, "x.txt")]
        assert not read.deleted and read.version == 1
        with unit_of_work() as other:
            vectors = connect().vectors(other.session)
            delete_document(other, vectors, tenant, read.id, queue=suite_queue())
        locked = document_for_tenant(reader.session, tenant, read.id, for_update=True)
        assert locked is not None and locked.deleted and locked.version == 2
