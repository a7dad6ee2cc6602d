"""``concord sync``: a directory mirrored into a tenant through the real queue and worker,
incrementally by content hash, with deletes under --prune, a dry run that sends nothing, and a
second run that sends nothing either."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from services.cli.main import app
from shared.db import unit_of_work
from shared.documents.repository import live_content_hashes
from shared.stores.compose import connect
from tests.conftest import wait_for
from tests.helpers import suite_queue


def _sync(directory: Path, tenant: str, *flags: str) -> str:
    result = CliRunner().invoke(app, ["sync", str(directory), "--tenant", tenant, *flags])
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def _live(tenant: str) -> dict[str, str]:
    with unit_of_work() as uow:
        return live_content_hashes(uow.session, tenant, "")


def test_sync_sends_only_what_changed_and_prunes_what_is_gone(
    tmp_path: Path, tenant: str, worker: Any
) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.md").write_text("# Moss\nSphagnum moss holds twenty times its weight.")
    (tmp_path / "b.txt").write_text("Tides follow the moon.")
    (tmp_path / "sub" / "c.html").write_text("<p>Reefs shelter fish.</p>")
    (tmp_path / ".hidden").write_text("never sent")

    planned = _sync(tmp_path, tenant, "--dry-run")
    assert "3 new, 0 changed, 0 to retry, 0 unchanged, 0 failed before, 0 to delete" in planned
    assert "nothing sent" in planned
    assert _live(tenant) == {}

    first = _sync(tmp_path, tenant, "--wait")
    assert "sent 3 event(s)" in first and "indexed 3 of 3" in first
    assert set(_live(tenant)) == {"a.md", "b.txt", "sub/c.html"}
    assert "in sync: nothing to send" in _sync(tmp_path, tenant)

    (tmp_path / "b.txt").write_text("Tides follow the moon and the sun.")
    (tmp_path / "a.md").unlink()
    (tmp_path / "d.txt").write_text("Dunes move with the wind.")
    before = _live(tenant)
    kept = _sync(tmp_path, tenant, "--wait")  # without --prune nothing is deleted
    assert "1 new, 1 changed, 0 to retry, 1 unchanged, 0 failed before, 0 to delete" in kept
    assert "a.md" in _live(tenant) and _live(tenant)["b.txt"] != before["b.txt"]

    pruned = _sync(tmp_path, tenant, "--prune")
    assert "0 new, 0 changed, 0 to retry, 3 unchanged, 0 failed before, 1 to delete" in pruned
    assert "delete a.md" in pruned
    wait_for(lambda: "a.md" not in _live(tenant) or None, 30, what="a.md deleted")
    assert set(_live(tenant)) == {"b.txt", "sub/c.html", "d.txt"}
    assert "in sync: nothing to send" in _sync(tmp_path, tenant, "--prune")


def test_content_that_already_failed_is_not_sent_again_unless_retried(
    tmp_path: Path, tenant: str, worker: Any
) -> None:
    """Before, a scheduled sync sent the same refused files on every run, making fresh dead
    letters each time. A failed job's content and a content refused at intake are now held
    back until they change, or sent again with --retry-failed."""
    (tmp_path / "ok.txt").write_text("Glaciers carve valleys.")
    (tmp_path / "no-text.json").write_text('{"title": "Bark", "colour": "grey"}')  # job fails
    (tmp_path / "picture.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))  # refused

    def run(*flags: str, exit_code: int) -> str:
        result = CliRunner().invoke(app, ["sync", str(tmp_path), "--tenant", tenant, *flags])
        assert result.exit_code == exit_code, result.output
        return " ".join(result.output.split())

    first = run("--wait", exit_code=1)
    assert "indexed 1 of 3, 2 failed" in first
    # A refusal of ok.txt's very bytes (a producer's event with a bad field) does not make the
    # indexed document "failed before": its live version holds those bytes.
    from shared.documents.events import accept_upload_events, build_upload_event
    from shared.settings import get_settings

    bad = build_upload_event(
        tenant_id=tenant, external_id="ok.txt", raw=(tmp_path / "ok.txt").read_bytes()
    )
    with unit_of_work() as uow:
        refused = accept_upload_events(
            connect(), uow, [{**bad, "metadata": ["not", "an object"]}], get_settings()
        )
    assert refused.rejected == 1
    again = run(exit_code=0)
    assert "0 new, 0 changed, 0 to retry, 1 unchanged, 2 failed before (not sent again" in again
    assert "failed no-text.json" in again and "failed picture.png" in again
    assert "in sync: nothing to send" in again

    retried = run("--retry-failed", "--wait", exit_code=1)
    assert "2 to retry" in retried and "sent 2 event(s)" in retried
    assert "indexed 0 of 2, 2 failed" in retried
    assert "no record has any of the text fields" in retried

    (tmp_path / "no-text.json").write_text('{"title": "Bark", "text": "Bark is grey."}')
    fixed = run("--wait", exit_code=0)
    assert "0 new, 1 changed, 0 to retry, 1 unchanged, 1 failed before" in fixed
    assert "indexed 1 of 1" in fixed


def test_prune_refuses_an_empty_directory_or_deleting_most_of_the_prefix_without_force(
    tmp_path: Path, tenant: str, worker: Any
) -> None:
    source = tmp_path / "docs"
    source.mkdir()
    for i in range(4):
        (source / f"{i}.txt").write_text(f"Note {i} about rivers and their deltas.")
    _sync(source, tenant, "--wait")
    empty = tmp_path / "empty"
    empty.mkdir()

    def refused(directory: Path, *flags: str) -> str:
        result = CliRunner().invoke(app, ["sync", str(directory), "--tenant", tenant, *flags])
        assert result.exit_code == 2, result.output
        return " ".join(result.output.split())

    assert "the directory is empty: --prune would delete all 4 documents" in refused(
        empty, "--prune"
    )
    for i in range(3):
        (source / f"{i}.txt").unlink()
    assert "--prune would delete 3 of the prefix's 4 documents" in refused(source, "--prune")
    planned = _sync(source, tenant, "--prune", "--dry-run")  # the plan says so, sends nothing
    assert "3 to delete" in planned and "--force deletes anyway" in planned
    assert len(_live(tenant)) == 4
    forced = _sync(source, tenant, "--prune", "--force")
    assert "sent 3 event(s)" in forced
    wait_for(lambda: len(_live(tenant)) == 1 or None, 30, what="three deleted")


def test_sync_refuses_what_it_cannot_do_clearly(tmp_path: Path, tenant: str) -> None:
    result = CliRunner().invoke(app, ["sync", str(tmp_path / "absent"), "--tenant", tenant])
    assert result.exit_code == 2 and "is not a directory" in " ".join(result.output.split())
    result = CliRunner().invoke(app, ["sync", str(tmp_path), "--tenant", tenant, "--by-reference"])
    assert result.exit_code == 2 and "CONCORD_INGEST_CONTENT_ROOT" in " ".join(
        result.output.split()
    )


def test_a_prefix_must_name_a_directory_of_external_ids(tmp_path: Path, tenant: str) -> None:
    result = CliRunner().invoke(
        app, ["sync", str(tmp_path), "--tenant", tenant, "--prefix", "team1", "--prune"]
    )
    assert result.exit_code == 2 and "must end with '/'" in " ".join(result.output.split())


def test_a_discarded_refusal_is_remembered_and_only_job_letters_offer_replay(
    tmp_path: Path, tenant: str, worker: Any
) -> None:
    """After `concord dlq discard 1`, the next sync once planned the same broken file as
    new, sent it again, and it was dead-lettered again under a new id; and every intake
    letter offered a Replay that could only fail."""
    import pytest

    from shared.admin import service as ops
    from shared.errors import BadRequest, NotFound
    from shared.jobs.service import dead_letter_view

    (tmp_path / "ok.txt").write_text("Glaciers carve valleys.")
    (tmp_path / "fake.pdf").write_bytes(b"MZ\x90\x00" + bytes(range(200)))  # refused at intake
    result = CliRunner().invoke(app, ["sync", str(tmp_path), "--tenant", tenant, "--wait"])
    assert result.exit_code == 1, result.output
    with unit_of_work() as uow:
        (letter,) = ops.list_dead_letters(uow.session, tenant_id=tenant, limit=10)
        view = dead_letter_view(letter)
    assert view.source == "event" and not view.replayable
    assert "corrected upload" in view.remedy
    with pytest.raises(BadRequest, match="corrected upload"), unit_of_work() as uow:
        ops.replay_dead_letter(uow, view.id, tenant, queue=suite_queue())
    with unit_of_work() as uow:
        ops.discard_dead_letter(uow.session, view.id, tenant)
    with unit_of_work() as uow:
        assert ops.list_dead_letters(uow.session, tenant_id=tenant, limit=10) == []
    with pytest.raises(NotFound), unit_of_work() as uow:
        ops.get_dead_letter(uow.session, view.id, tenant)
    again = _sync(tmp_path, tenant)
    assert "0 new, 0 changed, 0 to retry, 1 unchanged, 1 failed before" in again
    assert "in sync: nothing to send" in again
    with unit_of_work() as uow:  # nothing was sent: no new letter
        assert ops.list_dead_letters(uow.session, tenant_id=tenant, limit=10) == []
