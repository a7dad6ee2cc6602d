"""The CLI's errors (services/cli/errors.py): one line a person can act on, an exit status per
class, no traceback without --debug; and no configured key on the screen."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import typer

from services.cli import errors
from services.cli.main import app
from shared.errors import BadRequest, NotFound, StoreUnavailable


def _commands() -> Iterator[list[str]]:
    """The path of every command of the tree (``["keys", "create"]``, ...)."""

    def walk(command: object, path: list[str]) -> Iterator[list[str]]:
        children = getattr(command, "commands", None)
        if children:
            for name, child in children.items():
                yield from walk(child, [*path, name])
        else:
            yield path

    yield from walk(typer.main.get_command(app), [])


COMMANDS = list(_commands())


def test_the_tree_is_walked() -> None:
    assert ["keys", "create"] in COMMANDS and ["dlq", "replay"] in COMMANDS
    assert len(COMMANDS) > 20


@pytest.mark.parametrize("path", COMMANDS, ids=[" ".join(p) for p in COMMANDS])
def test_every_command_answers_a_bad_option_in_one_line_without_a_traceback(
    path: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    status = errors.run(app, [*path, "--no-such-option", "x"])
    out, err = capsys.readouterr()
    assert status == errors.EXIT_USAGE
    lines = [line for line in (out + err).splitlines() if line.strip()]
    assert len(lines) <= 3, lines
    assert "Traceback" not in out + err
    assert "--no-such-option" in err and f"concord {' '.join(path)} --help" in err


@pytest.mark.parametrize("path", COMMANDS, ids=[" ".join(p) for p in COMMANDS])
def test_no_command_shows_a_configured_key_in_its_help(
    path: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``concord search --help`` printed the key in CONCORD_API_KEY as the option's default."""
    secret = "ck_canary0123456789abcdefghijklmnopqrstuvwxyz0"
    monkeypatch.setenv("CONCORD_API_KEY", secret)
    assert errors.run(app, [*path, "--help"]) == 0
    out, err = capsys.readouterr()
    assert secret not in out + err and secret[:12] not in out + err


@pytest.mark.parametrize(
    ("error", "status", "label"),
    [
        (NotFound("dead letter 999 not found"), errors.EXIT_NOT_FOUND, "not found:"),
        (
            BadRequest("scopes must be a subset of read, write, admin"),
            errors.EXIT_REFUSED,
            "refused:",
        ),
        (
            StoreUnavailable("Elasticsearch does not answer"),
            errors.EXIT_UNAVAILABLE,
            "unavailable:",
        ),
        (RuntimeError("something unexpected"), errors.EXIT_FAILED, "error:"),
    ],
)
def test_each_class_of_error_has_its_status_and_one_line(
    error: Exception, status: int, label: str, capsys: pytest.CaptureFixture[str]
) -> None:
    probe = typer.Typer()

    @probe.command()
    def fail() -> None:
        raise error

    @probe.command()
    def other() -> None:  # two commands: the probe is a group, as concord is
        pass

    assert errors.run(probe, ["fail"]) == status
    _, err = capsys.readouterr()
    assert err.startswith(label) and "Traceback" not in err
    assert len(err.strip().splitlines()) <= 2  # the line, and for a bug: where to get more


def test_debug_prints_the_traceback_after_the_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(errors, "_debug", False)
    probe = typer.Typer()

    @probe.command()
    def fail() -> None:
        raise RuntimeError("boom")

    @probe.command()
    def other() -> None:
        pass

    monkeypatch.setenv("CONCORD_DEBUG", "1")
    assert errors.run(probe, ["fail"]) == errors.EXIT_FAILED
    _, err = capsys.readouterr()
    assert err.startswith("error: RuntimeError: boom") and "Traceback" in err
