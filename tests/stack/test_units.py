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
