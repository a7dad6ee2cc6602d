"""Console output shared by the CLI commands."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape


def print_error(console: Console, message: object, label: str | None = None) -> None:
    """``message`` in red, or after a red ``label``. Error texts quote paths, log lines and
    JSON, whose square brackets rich would otherwise read as markup tags (and fail on)."""
    text = escape(str(message))
    console.print(f"[red]{escape(label)}[/] {text}" if label else f"[red]{text}[/]")
