"""Upload events through the real worker: accepted together, in order, a slice a
transaction; an event that can never be accepted is dead-lettered with its reason, and its
neighbours, any tenant's, are accepted."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import select

from shared.db import unit_of_work
from shared.documents.events import build_upload_event
from shared.jobs.repository import live_job_states
from shared.models import DeadLetter
from shared.queue import publish_upload_event
from tests.conftest import wait_for
from tests.helpers import (
    pg_chunks,
    search,
    wait_converged,
)


def test_malformed_upload_events_are_dead_lettered_with_the_reason(tenant, worker):
    publish_upload_event(
        {
            "schema": "concord.upload/v1",
            "tenant_id": tenant,
            "external_id": "bad.bin",
            "content_base64": "!!!not base64!!!",
        }
    )

    def letter() -> DeadLetter | None:
        with unit_of_work() as uow:
            return uow.session.scalar(select(DeadLetter).where(DeadLetter.tenant_id == tenant))

    found = wait_for(letter, 30, what="the malformed event's dead letter")
    assert found.source == "event" and found.ref == "bad.bin"
    assert "base64" in found.message and "content_base64" not in found.payload


def test_events_published_together_are_accepted_together_and_indexed_as_one_batch(
    client: TestClient, auth, tenant, worker
):
    from shared.models import IngestJob
    from shared.queue import publish_upload_events

    def event(external_id: str, text: str) -> dict[str, Any]:
        return build_upload_event(tenant_id=tenant, external_id=external_id, raw=text.encode())

    publish_upload_events(
        [
            event("kelp.txt", "Kelp forests grow half a metre a day in cold water."),
            {"schema": "concord.upload/v1", "tenant_id": tenant, "external_id": "bad.bin"},
            event("coral.txt", "Corals build reefs from calcium carbonate over centuries."),
            event("kelp.txt", "Kelp forests grow half a metre a day in cold water."),  # same
        ]
    )

    def indexed() -> bool | None:
        with unit_of_work() as uow:
            states = live_job_states(uow.session, tenant, ["kelp.txt", "coral.txt"])
        return (set(states.values()) == {"indexed"} and len(states) == 2) or None

    wait_for(indexed, 60, what="both documents indexed")
    with unit_of_work() as uow:
        jobs = uow.session.scalars(select(IngestJob).where(IngestJob.tenant_id == tenant)).all()
        letter = uow.session.scalar(select(DeadLetter).where(DeadLetter.tenant_id == tenant))
    assert len(jobs) == 2  # the repeated kelp event was unchanged: no second version or job
    assert len({job.started_at for job in jobs}) == 1  # one claim took both
    assert letter is not None and letter.ref == "bad.bin" and "content_base64" in letter.message
    wait_converged(tenant)
    assert search(client, auth, "calcium carbonate reefs")["results"][0]["text"].startswith(
        "Corals"
    )


def test_events_with_fields_postgres_cannot_store_are_dead_lettered_with_the_reason(
    client: TestClient, auth, tenant, worker
):
    """Refused at the door, each with its reason, in the message's own transaction: the
    events around them are accepted."""
    from shared.queue import publish_upload_events

    good = [
        build_upload_event(tenant_id=tenant, external_id=f"{name}.txt", raw=text.encode())
        for name, text in [("tide", "Tides follow the moon."), ("reef", "Reefs shelter fish.")]
    ]
    bad: dict[str, tuple[dict[str, Any], str]] = {
        "nul.txt": ({"metadata": {"note": "a\x00b"}}, "NUL"),
        "nan.txt": ({"metadata": {"score": float("nan")}}, "NaN"),
        "surrogate.txt": ({"metadata": {"note": "a\ud800b"}}, "lone surrogate"),
        "long-title.txt": ({"title": "t" * 1001}, "title is 1001 characters"),
        "number-title.txt": ({"title": 7}, "'title' must be a string"),
    }
    events = [
        {**build_upload_event(tenant_id=tenant, external_id=name, raw=b"fine text"), **fields}
        for name, (fields, _) in bad.items()
    ]
    publish_upload_events([good[0], *events, good[1]])

    def letters() -> dict[str, DeadLetter] | None:
        with unit_of_work() as uow:
            found = uow.session.scalars(
                select(DeadLetter).where(DeadLetter.tenant_id == tenant)
            ).all()
        return {letter.ref: letter for letter in found} if len(found) == len(bad) else None

    found = wait_for(letters, 60, what="a dead letter for each refused event")
    for name, (_, reason) in bad.items():
        assert found[name].stage == "intake" and reason in found[name].message, name
    # Recorded although Postgres could not store them as they came.
    assert found["nul.txt"].payload["metadata"] == {"note": "a b"}
    assert found["surrogate.txt"].payload["metadata"] == {"note": "a\ufffdb"}
    assert found["nan.txt"].payload["metadata"] == {"score": "nan"}
    wait_for(lambda: len(pg_chunks(tenant)) == 2 or None, 60, what="both good documents")
    assert len(wait_converged(tenant)) == 2
    assert search(client, auth, "moon tides")["results"][0]["text"] == "Tides follow the moon."


def test_an_event_the_database_refuses_is_dead_lettered_and_its_neighbours_accepted(
    tenant, worker, monkeypatch
):
    """Should an event the door lets through fail in Postgres, the message's transaction
    fails, so its events are accepted one at a time: the others go through, the bad one
    becomes a dead letter. (The door's check is switched off to let a NUL through; the task
    runs in this process.)"""
    from shared.documents import events as upload_event
    from workers.tasks import accept_upload_events

    monkeypatch.setattr(upload_event, "check_upload", lambda *args: None)
    good = [
        build_upload_event(tenant_id=tenant, external_id=f"{name}.txt", raw=text.encode())
        for name, text in [("tide", "Tides follow the moon."), ("reef", "Reefs shelter fish.")]
    ]
    bad = build_upload_event(
        tenant_id=tenant, external_id="nul.txt", raw=b"fine text", metadata={"note": "a\x00b"}
    )
    result = accept_upload_events.apply(args=[[good[0], bad, good[1]]]).get()
    assert result == {"accepted": 2, "unchanged": 0, "rejected": 1, "deleted": 0}
    with unit_of_work() as uow:
        letter = uow.session.scalar(select(DeadLetter).where(DeadLetter.tenant_id == tenant))
    assert letter is not None and letter.ref == "nul.txt"
    assert "unicode" in letter.message.lower() and "[SQL:" not in letter.message
    assert letter.payload["metadata"] == {"note": "a b"}
    wait_for(lambda: len(pg_chunks(tenant)) == 2 or None, 60, what="both good documents")
    assert len(wait_converged(tenant)) == 2


def test_two_versions_of_one_document_in_one_message_end_at_the_second(
    client: TestClient, auth, tenant, worker
):
    from shared.queue import publish_upload_events

    publish_upload_events(
        [
            build_upload_event(tenant_id=tenant, external_id="log.txt", raw=text.encode())
            for text in ("The ship left port at dawn.", "The ship reached the island at dusk.")
        ]
    )

    def indexed() -> str | None:
        with unit_of_work() as uow:
            states = live_job_states(uow.session, tenant, ["log.txt"])
        return states.get("log.txt") if states.get("log.txt") == "indexed" else None

    wait_for(indexed, 60, what="the document's live version indexed")
    assert set(wait_converged(tenant).values()) == {2}  # version 1's chunks are gone
    found = search(client, auth, "ship island")["results"]
    assert [r["text"] for r in found] == ["The ship reached the island at dusk."]
    document_id = found[0]["document_id"]
    versions = client.get(f"/v1/documents/{document_id}", headers=auth).json()["versions"]
    assert [v["version"] for v in versions] == [1, 2]
