"""Upload events that delete, and content by reference: the JSON Schema file agrees with the
code on every case, a reference cannot leave the shared root, and a message mixing one
tenant's ordinary events with another tenant's bad ones harms only the bad ones."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from shared.db import unit_of_work
from shared.documents.events import build_delete_event, build_upload_event
from shared.documents.repository import documents_by_external_ids
from shared.models import DeadLetter
from shared.stores.compose import connect
from tests.conftest import wait_for
from tests.helpers import pg_chunks, wait_converged

TEXT = base64.b64encode(b"Tides follow the moon.").decode()


def test_deletes_and_references_in_one_message_with_another_tenants_bad_events(
    worker: Any, content_root: Path, tenant: str
) -> None:
    """One message: this tenant's ordinary events (inline, by reference, a delete of what it
    wrote first, a delete of nothing) between another tenant's poison (a traversal, a delete
    with content): the poison is dead-lettered with its reason; this tenant loses nothing."""
    from workers.tasks import accept_upload_events

    (content_root / tenant / "notes").mkdir(parents=True)
    (content_root / tenant / "notes" / "reef.txt").write_bytes(b"Reefs shelter fish.")
    other = f"{tenant}-other"
    first = [
        build_upload_event(tenant_id=tenant, external_id="tide.txt", raw=b"Tides follow the moon."),
        build_upload_event(tenant_id=tenant, external_id="reef.txt", content_path="notes/reef.txt"),
        build_upload_event(tenant_id=tenant, external_id="gone.txt", raw=b"Soon deleted, this."),
    ]
    nested: Any = "bottom"
    for _ in range(600):  # deeper than Python's recursion allows a naive walk of it
        nested = {"deeper": nested}
    poison = [
        build_upload_event(tenant_id=other, external_id="x", content_path="../../etc/passwd"),
        {**build_delete_event(tenant_id=other, external_id="y"), "content_base64": TEXT},
        # refused, and its dead letter must still be written (it once raised RecursionError,
        # which ended the message: the events after it were never accepted nor recorded)
        {
            **build_upload_event(tenant_id=other, external_id="z" * 5000, raw=b"z"),
            "metadata": nested,
        },
    ]
    result = accept_upload_events.apply(
        args=[[first[0], poison[0], first[1], poison[1], poison[2], first[2]]]
    ).get()
    assert result == {"accepted": 3, "unchanged": 0, "rejected": 3, "deleted": 0}
    wait_for(lambda: len(pg_chunks(tenant)) == 3 or None, 90, what="the three documents")

    second = [
        build_delete_event(tenant_id=tenant, external_id="gone.txt"),
        build_delete_event(tenant_id=tenant, external_id="never-was.txt"),  # a no-op
    ]
    result = accept_upload_events.apply(args=[second]).get()
    assert result == {"accepted": 0, "unchanged": 1, "rejected": 0, "deleted": 1}
    assert accept_upload_events.apply(args=[second]).get()["unchanged"] == 2  # replayed
    wait_converged(tenant)
    with unit_of_work() as uow:
        documents = documents_by_external_ids(
            uow.session, [(tenant, e) for e in ("tide.txt", "reef.txt", "gone.txt")]
        )
        live = {external for (_, external), d in documents.items() if not d.deleted}
        live_ids = {str(d.id) for d in documents.values() if not d.deleted}
    assert live == {"tide.txt", "reef.txt"}
    assert {cid.split(":")[0] for cid in pg_chunks(tenant)} == live_ids
    with unit_of_work() as uow:
        letters = uow.session.scalars(select(DeadLetter).where(DeadLetter.tenant_id == other)).all()
        reasons = sorted(letter.message for letter in letters)
        deep = next(letter for letter in letters if letter.ref.startswith("z"))
    assert len(reasons) == 3
    assert any("content root" in r or "relative" in r for r in reasons)
    assert any("delete event names only the document" in r for r in reasons)
    assert len(deep.ref) == 512 and "nested deeper than 16 levels" in json.dumps(deep.payload)


def test_a_message_of_many_events_is_accepted_in_order_a_slice_at_a_time(
    worker: Any, content_root: Path, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A producer (not the CLI's batcher) puts 73 events in one message, 70 of them naming
    files: they are accepted at most EVENTS_PER_MESSAGE to a transaction (so at most that
    many files are held at once), in order across the slices (a delete, then the same
    document again), and another tenant's poison among them is dead-lettered alone."""
    import workers.tasks as tasks
    from shared.documents.events import EVENTS_PER_MESSAGE

    notes = content_root / tenant / "notes"
    notes.mkdir(parents=True)
    events = []
    for i in range(70):
        (notes / f"doc-{i}.txt").write_bytes(f"Field note {i} on the salt marsh.".encode())
        events.append(
            build_upload_event(
                tenant_id=tenant, external_id=f"doc-{i}.txt", content_path=f"notes/doc-{i}.txt"
            )
        )
    poison = build_upload_event(
        tenant_id=f"{tenant}-other", external_id="x", content_path="../../etc/passwd"
    )
    events.insert(33, poison)
    events.append(build_delete_event(tenant_id=tenant, external_id="doc-0.txt"))
    events.append(
        build_upload_event(tenant_id=tenant, external_id="doc-0.txt", raw=b"Revived after it.")
    )
    slices: list[int] = []
    real_accept = tasks._accept_together

    def accept(listed: list[Any]) -> Any:
        slices.append(len(listed))
        return real_accept(listed)

    monkeypatch.setattr(tasks, "_accept_together", accept)
    result = tasks.accept_upload_events.apply(args=[events]).get()

    assert slices == [EVENTS_PER_MESSAGE, EVENTS_PER_MESSAGE, 73 - 2 * EVENTS_PER_MESSAGE]
    assert result == {"accepted": 71, "unchanged": 0, "rejected": 1, "deleted": 1}
    wait_for(lambda: len(pg_chunks(tenant)) == 70 or None, 120, what="the 70 documents")
    wait_converged(tenant)
    with unit_of_work() as uow:
        revived = documents_by_external_ids(uow.session, [(tenant, "doc-0.txt")])
    (document,) = revived.values()
    assert not document.deleted and document.version == 3  # written, deleted, written again


def test_a_slice_that_fails_after_others_committed_goes_on_as_a_message_of_its_own(
    worker: Any, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first slice committed; the second fails here (as a store out of reach would): the
    task does not fail the message (its retry would apply the first slice again), the rest
    go on in a message of their own, which the worker accepts; every document ends live."""
    import workers.tasks as tasks
    from shared.documents.events import EVENTS_PER_MESSAGE

    total = EVENTS_PER_MESSAGE + 8
    events = [
        build_upload_event(tenant_id=tenant, external_id=f"n-{i}.txt", raw=f"Note {i}.".encode())
        for i in range(total)
    ]
    real_accept = tasks._accept_together
    calls: list[int] = []

    def accept(listed: list[Any]) -> Any:
        calls.append(len(listed))
        if len(calls) == 2:
            raise RuntimeError("the second slice fails here")
        return real_accept(listed)

    monkeypatch.setattr(tasks, "_accept_together", accept)
    result = tasks.accept_upload_events.apply(args=[events]).get()
    assert result == {"accepted": EVENTS_PER_MESSAGE, "unchanged": 0, "rejected": 0, "deleted": 0}
    assert calls == [EVENTS_PER_MESSAGE, 8]
    wait_for(lambda: len(pg_chunks(tenant)) == total or None, 120, what="every document")
    with unit_of_work() as uow:
        documents = documents_by_external_ids(
            uow.session, [(tenant, f"n-{i}.txt") for i in range(total)]
        )
    assert all(d.version == 1 and not d.deleted for d in documents.values())  # none twice


def test_a_delete_after_an_upload_in_one_message_waits_for_the_writer_of_its_document(
    tenant: str,
) -> None:
    """A message uploads one document and deletes another while an ingest worker writes the
    deleted one (it holds the document's key and then needs its row, for its chunks' foreign
    keys). The message takes that key before any row lock and waits; the writer finishes,
    and the delete follows. (Locking the row first deadlocked them: Postgres cancelled one,
    seen in CI as a slice that went on in a message of its own.)"""
    import threading

    from sqlalchemy import text

    from shared.db.repository import limit_statements, lock_key
    from shared.documents.events import accept_upload_events
    from shared.settings import get_settings

    settings = get_settings()
    event = build_upload_event(tenant_id=tenant, external_id="old.txt", raw=b"Soon deleted.")
    with unit_of_work() as uow:
        accept_upload_events(connect(), uow, [event], settings)
        doc_id = documents_by_external_ids(uow.session, [(tenant, "old.txt")])[
            (tenant, "old.txt")
        ].id
    message = [
        build_upload_event(tenant_id=tenant, external_id="new.txt", raw=b"Freshly written."),
        build_delete_event(tenant_id=tenant, external_id="old.txt"),
    ]
    outcomes: list[Any] = []

    def accept_message() -> None:
        try:
            with unit_of_work() as uow:
                outcomes.append(accept_upload_events(connect(), uow, message, settings).counts())
        except Exception as e:  # the deadlock, before the fix
            outcomes.append(e)

    def waiting_for_a_key() -> bool:
        waiting = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        with unit_of_work() as uow:
            return bool(uow.session.scalar(text(waiting)))

    with unit_of_work() as writer:  # the ingest worker, mid-write
        limit_statements(writer.session, 20)
        lock_key(writer.session, f"document:{doc_id}")
        accepting = threading.Thread(target=accept_message, daemon=True)
        accepting.start()
        wait_for(waiting_for_a_key, 30, interval=0.05, what="the message to wait for the key")
        # the chunks' foreign keys: a KEY SHARE lock on the document's row
        writer.session.execute(
            text("SELECT id FROM documents WHERE id = :id FOR KEY SHARE"), {"id": doc_id}
        )
    accepting.join(30)
    assert outcomes == [{"accepted": 1, "unchanged": 0, "rejected": 0, "deleted": 1}]
