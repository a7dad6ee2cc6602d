"""The concord command through its real entry point against the real stack."""

from __future__ import annotations

import json
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import select

from shared.db import unit_of_work
from shared.jobs.repository import live_job_states
from shared.models import Document
from tests.helpers import (
    search,
    wait_converged,
)


def test_cli_ingest_publishes_events_and_waits(client: TestClient, auth, tenant, worker, tmp_path):
    """Documents are named by their path under the directory given (from any working
    directory), and --wait settles as soon as every upload is indexed or has failed, naming
    each failure with its reason and exiting 1."""
    import subprocess
    import sys
    import time

    (tmp_path / "a.md").write_text("# Moss\nSphagnum moss holds twenty times its weight.")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.html").write_text("<h1>Lichen</h1><p>Lichens pioneer bare rock.</p>")
    (tmp_path / "sub" / "c.jsonl").write_text(
        '{"title": "Fern", "text": "Ferns spread by spores."}\n'
    )
    (tmp_path / "sub" / "no-text.json").write_text('{"title": "Bark", "colour": "grey"}')
    (tmp_path / "picture.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" * 20)
    started = time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "services.cli.main",
            "ingest",
            str(tmp_path),
            "--tenant",
            tenant,
            "--wait",
            "--timeout",
            "120",
        ],
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )
    output = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 1, output
    assert time.monotonic() - started < 60, output  # settled, not the 120 s timeout
    assert "published 5 upload event(s)" in output
    assert "indexed 3 of 5, 2 failed" in output
    assert "sub/no-text.json: " in output and "no record has any of the text fields" in output
    assert "picture.png: " in output
    assert "not yet accepted" not in output and "not finished" not in output
    wait_converged(tenant)
    assert search(client, auth, "pioneer bare rock")["results"][0]["section"] == "Lichen"
    # What `--wait` polls, for a directory of more documents than a statement has parameters
    # for (Postgres allows 65,535): one array parameter, not one per id.
    with unit_of_work() as uow:
        ids = list(
            uow.session.scalars(select(Document.external_id).where(Document.tenant_id == tenant))
        )
        many = [f"absent-{i}" for i in range(70_000)] + ids
        states = live_job_states(uow.session, tenant, many)
    assert sorted(ids) == ["a.md", "sub/b.html", "sub/c.jsonl", "sub/no-text.json"]
    assert {i: s for i, s in states.items() if s == "indexed"} == dict.fromkeys(
        ["a.md", "sub/b.html", "sub/c.jsonl"], "indexed"
    )


def test_piped_cli_tables_are_whole_and_dlq_commands_say_what_they_do(tenant: str) -> None:
    """Before, tables printed to a pipe were cut to 80 columns (ids and errors with them);
    the dlq commands had no help text."""
    import subprocess
    import sys

    from shared.jobs.repository import add_dead_letter

    ref = "reports/2026/" + "quarterly-" * 12 + "summary.json"  # 137 characters
    with unit_of_work() as uow:
        add_dead_letter(
            uow.session,
            tenant_id=tenant,
            source="event",
            ref=ref,
            stage="intake",
            error_class="ParseError",
            message="the document is not valid UTF-8 (byte 0: b'\\x89'); re-encode it as UTF-8",
            attempts=1,
        )

    def concord(*args: str) -> str:
        run = subprocess.run(
            [sys.executable, "-m", "services.cli.main", *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert run.returncode == 0, run.stdout + run.stderr
        return run.stdout

    stats = json.loads(concord("stats", "--tenant", tenant, "--json"))
    assert stats["dead_letters"] == 1 and stats["documents"] == 0  # this tenant's alone
    listed = concord("dlq", "list", "--tenant", tenant)
    assert ref in listed and "re-encode it as UTF-8" in listed
    helps = concord("dlq", "--help")
    for command, words in (
        ("list", "newest dead letters"),
        ("show", "whole"),
        ("discard", "without running it again"),
    ):
        assert command in helps
        assert words in " ".join(concord("dlq", command, "--help").split())


def test_every_one_tenant_command_takes_its_tenant_from_the_key_or_tenant_alike(
    tenant: str, api_key: str, capsys: Any, monkeypatch: Any
) -> None:
    """Before, `search` took the tenant from the key while `sync` and `ingest` needed
    --tenant. Every command that acts on one tenant's data takes --tenant, or else the key's
    tenant; neither is a one-line usage error, a wrong key a refusal."""
    from services.cli.errors import EXIT_REFUSED, EXIT_USAGE, run
    from services.cli.main import app

    monkeypatch.delenv("CONCORD_API_KEY", raising=False)
    assert run(app, ["reranker", "list"]) == EXIT_USAGE
    assert "pass --tenant T, or set CONCORD_API_KEY" in capsys.readouterr().err
    monkeypatch.setenv("CONCORD_API_KEY", api_key)
    assert run(app, ["reranker", "list"]) == 0
    from_key = capsys.readouterr().out
    assert run(app, ["reranker", "list", "--tenant", tenant]) == 0
    assert capsys.readouterr().out == from_key
    monkeypatch.setenv("CONCORD_API_KEY", "ck_" + "0" * 43)
    assert run(app, ["reranker", "list"]) == EXIT_REFUSED
