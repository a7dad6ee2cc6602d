"""Console output shared by the CLI commands."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.markup import escape

# Output piped to a file or another program is read whole: a table there is as wide as its
# cells (rich would cut it to 80 columns, and ids and timestamps with it).
PIPED_WIDTH = 4096


def cli_console(stderr: bool = False) -> Console:
    """The console of a CLI command: the terminal's width, or all of it when piped."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else PIPED_WIDTH)


def print_error(console: Console, message: object, label: str | None = None) -> None:
    """``message`` in red, or after a red ``label``. Error texts quote paths, log lines and
    JSON, whose square brackets rich would otherwise read as markup tags (and fail on)."""
    text = escape(str(message))
    console.print(f"[red]{escape(label)}[/] {text}" if label else f"[red]{text}[/]")
