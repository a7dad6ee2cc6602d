"""What the `concord` command prints when something goes wrong: one line a person can act
on (what failed, why, what to do), and an exit status per class of failure. Every command's
errors go through :func:`run`, so no command prints a traceback of its own; ``--debug`` (or
``CONCORD_DEBUG=1``) prints it besides, for a bug report.

Exit statuses: 0 done; 1 the command ran and what it checks failed (drift remains, a file
failed), or an unexpected error; 2 usage (a missing or malformed option or argument); 3 not
found; 4 refused (the request is not one Concord can do: a bad value, a conflict, no
permission); 5 unavailable (Postgres, Redis, Elasticsearch or the API does not answer)."""

from __future__ import annotations

import os
import traceback

import typer

# Typer (0.29) carries its own copy of click: its usage errors are those, not click's.
from typer._click import exceptions as click_errors

from services.cli.output import cli_console, print_error
from shared.errors import (
    ConcordError,
    Conflict,
    Forbidden,
    NotFound,
    StoreUnavailable,
    TooManyRequests,
    Unauthorized,
)

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_REFUSED = 4
EXIT_UNAVAILABLE = 5

_debug = False


def set_debug(on: bool) -> None:
    """``--debug``: tracebacks are printed after the one-line message."""
    global _debug
    _debug = _debug or on


def run(app: typer.Typer, args: list[str] | None = None) -> int:
    """Run ``app`` and turn every error into its line and exit status."""
    set_debug(os.environ.get("CONCORD_DEBUG", "") not in ("", "0"))
    err = cli_console(stderr=True)
    try:
        result = app(args=args, prog_name="concord", standalone_mode=False)
        return result if isinstance(result, int) else 0
    except typer.Exit as e:
        return e.exit_code
    except typer.Abort:
        print_error(err, "interrupted")
        return 130
    except click_errors.NoArgsIsHelpError as e:  # a group named alone: its help
        typer.echo(e.ctx.get_help() if e.ctx else e.format_message())
        return e.exit_code
    except click_errors.UsageError as e:
        command = e.ctx.command_path if e.ctx else "concord"
        print_error(err, f"{e.format_message()} (see: {command} --help)", label="usage:")
        return EXIT_USAGE
    except Exception as e:  # every error, one line: the classes below say which
        status, label, message = describe(e)
        print_error(err, message, label=label)
        if _debug:
            traceback.print_exc()
        elif status == EXIT_FAILED:
            err.print("(run with --debug for the traceback)")
        return status


def describe(error: Exception) -> tuple[int, str, str]:
    """(exit status, label, message) for ``error``."""
    unavailable = _unavailable(error)
    if unavailable is not None:
        return EXIT_UNAVAILABLE, "unavailable:", unavailable
    if isinstance(error, NotFound):
        return EXIT_NOT_FOUND, "not found:", error.message
    if isinstance(error, Unauthorized | Forbidden):
        return EXIT_REFUSED, "refused:", error.message
    if isinstance(error, Conflict | TooManyRequests):
        return EXIT_REFUSED, "refused:", error.message
    if isinstance(error, ConcordError) and error.status_code < 500:
        return EXIT_REFUSED, "refused:", error.message
    if isinstance(error, ConcordError):
        return EXIT_FAILED, "error:", error.message
    return EXIT_FAILED, "error:", f"{type(error).__name__}: {error}"


def usage(message: str) -> Exception:
    """A usage error a command finds itself (an option missing that the environment may give
    instead): exit status 2, as a parse error."""
    return click_errors.UsageError(message)


def api_error(status: int, body: str) -> ConcordError:
    """The error an API answer stands for: its own message, classed by its status."""
    import json

    try:
        message = str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        message = body.strip()[:300] or f"the API answered {status}"
    if status == 404:
        return NotFound(message)
    if status >= 500:
        return StoreUnavailable(f"the API answered {status}: {message}")
    error = ConcordError(message)
    error.status_code = status  # a 4xx: refused
    return error


def _unavailable(error: Exception) -> str | None:
    """What does not answer, and what to do, if ``error`` says a service is down."""
    import httpx
    import redis
    import sqlalchemy.exc
    from elastic_transport import ConnectionError as ElasticsearchDown

    hint = "start the stack (concord stack up) or check its status (concord stack status)"
    if isinstance(error, StoreUnavailable):
        return f"{error.message}; {hint}"
    if isinstance(error, sqlalchemy.exc.OperationalError | sqlalchemy.exc.InterfaceError):
        return f"Postgres does not answer ({_first_line(error.orig or error)}); {hint}"
    if isinstance(error, redis.ConnectionError | redis.TimeoutError):
        return f"Redis does not answer ({_first_line(error)}); {hint}"
    if isinstance(error, ElasticsearchDown):
        return f"Elasticsearch does not answer; {hint}"
    if isinstance(error, httpx.ConnectError | httpx.TimeoutException):
        return f"the API does not answer ({_first_line(error)}); {hint}"
    return None


def _first_line(error: object) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
