"""Unit tests of settings and the stack launcher (shared/settings.py, services/cli/stack/):
no services."""

from __future__ import annotations

import pytest


def test_settings_refuse_placeholder_secrets_outside_development() -> None:
    from pydantic import ValidationError

    from shared.settings import PLACEHOLDER_SECRETS, Settings

    for placeholder in PLACEHOLDER_SECRETS:
        with pytest.raises(ValidationError, match="CONCORD_PG_PASSWORD"):
            Settings(environment="production", pg_password=placeholder)
    assert Settings(environment="production", pg_password="s3cret-from-vault").pg_password
    assert Settings(environment="development").pg_password in PLACEHOLDER_SECRETS


def test_stack_errors_print_square_brackets_as_text(monkeypatch) -> None:
    """Elasticsearch's log lines name paths in square brackets, which rich would otherwise
    read as closing markup tags and fail on while reporting the real error."""
    from typer.testing import CliRunner

    from services.cli import stack, stack_commands

    message = "Elasticsearch did not become healthy\nsetting file [/x/operator/settings.json]"

    def refuse(settings: object) -> None:
        raise stack.StackError(message)

    monkeypatch.setattr(stack, "prepare_state_dir", refuse)
    result = CliRunner().invoke(stack_commands.app, ["up", "--infra-only"])
    assert result.exit_code == 1
    assert "[/x/operator/settings.json]" in result.output
    assert isinstance(result.exception, SystemExit)  # the error was reported, not a crash


def test_a_port_held_by_an_outgoing_connection_counts_as_taken() -> None:
    """The local end of a connection (ports in the ephemeral range are handed out for those)
    blocks a server from binding the port just as a listener does; probing with connect()
    missed it and the stack then failed to start with "Address already in use"."""
    import socket

    from services.cli.stack import _port_in_use

    with socket.socket() as listener, socket.socket() as client:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        client.connect(listener.getsockname())
        server_end, _ = listener.accept()
        with server_end:
            local_port = client.getsockname()[1]
            assert _port_in_use(local_port)  # nothing listens there, yet it cannot be bound
            assert _port_in_use(listener.getsockname()[1])
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    assert not _port_in_use(free)


def test_a_cluster_node_hands_the_service_user_its_own_files_and_no_other_nodes(
    tmp_path,
) -> None:
    """Restarting one node of a local cluster used to `chown -R` the whole Elasticsearch
    state tree, the running nodes' data included; a segment they merged away under it failed
    the restart (`chown` exits 1 on a file that vanished)."""
    import os
    import pwd

    from services.cli.stack.common import SERVICE_USER, _ensure_service_user
    from services.cli.stack.elasticsearch import ElasticsearchService
    from shared.settings import Settings

    if os.geteuid() != 0:
        pytest.skip("handing files to the service user needs root")
    _ensure_service_user()
    service_uid = pwd.getpwnam(SERVICE_USER).pw_uid
    settings = Settings(state_dir=tmp_path, es_nodes=3)
    first, second = ElasticsearchService(settings, 0), ElasticsearchService(settings, 1)
    for node in (first, second):
        for directory in (node.home / "bin", node.conf, node.data / "indices", node.logs):
            directory.mkdir(parents=True, exist_ok=True)
        (node.data / "indices" / "segment").write_text("x")

    first._give_to_service_user()

    owned = [first.root, first.home / "bin", first.conf, first.logs, first.data / "indices"]
    assert all(p.stat().st_uid == service_uid for p in owned)
    assert (first.data / "indices" / "segment").stat().st_uid == service_uid
    untouched = [second.own, second.data / "indices" / "segment"]
    assert all(p.stat().st_uid == 0 for p in untouched)  # the running node's files are its own


def test_only_the_sweep_runs_on_the_relay_workers_maintenance_queue() -> None:
    """The relay worker has one process: periodic work whose time grows with the corpus (the
    all-tenant reconcile, partition placement) would hold the sweep that recovers a dead
    worker's jobs, so it runs on the training queue, without the task time limit."""
    from shared.queue import MAINTENANCE_QUEUE, RECONCILE_TASK, SWEEP_TASK, TRAINING_QUEUE
    from workers.celery_app import celery_app
    from workers.tasks import reconcile_all

    schedule = celery_app.conf.beat_schedule.values()
    on_maintenance = {e["task"] for e in schedule if e["options"]["queue"] == MAINTENANCE_QUEUE}
    assert on_maintenance == {SWEEP_TASK}
    (reconcile,) = [e for e in schedule if e["task"] == RECONCILE_TASK]
    assert reconcile["options"]["queue"] == TRAINING_QUEUE == reconcile_all.queue
    assert not reconcile_all.acks_late  # a run lost with its worker is the next run's
