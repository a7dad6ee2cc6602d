"""`concord stack up | down | status`."""

from __future__ import annotations

import os
import time

import typer
from rich.table import Table

from services.cli import stack
from services.cli.output import cli_console, print_error
from shared.settings import Settings, get_settings

app = typer.Typer(
    help="Bring the local stack up or down, or report its status.", no_args_is_help=True
)
console = cli_console()


def _with_environment(name: str, value: str) -> Settings:
    """The settings with ``name`` set, in this process's environment: the app processes the
    supervisor starts inherit it."""
    os.environ[name] = value
    get_settings.cache_clear()
    return get_settings()


@app.command()
def up(
    infra_only: bool = typer.Option(
        False, "--infra-only", help="Start Postgres, Redis and Elasticsearch only."
    ),
    es_nodes: int = typer.Option(
        0,
        "--es-nodes",
        help="Run Elasticsearch as a local cluster of this many nodes (CONCORD_ES_NODES; "
        "in a fresh state directory: a single node's data cannot join a cluster).",
    ),
    pg_replica: bool = typer.Option(
        False,
        "--pg-replica",
        help="Also start a streaming replica of Postgres (CONCORD_PG_REPLICA_PORT, default the "
        "primary's port + 1) and have the API read the query path from it.",
    ),
) -> None:
    """Start every service (idempotent), migrate the schema and set up the ES index."""
    settings = get_settings()
    if es_nodes > 1 and settings.es_nodes != es_nodes:
        os.environ.setdefault("CONCORD_ES_REPLICAS", "1")  # losing a node loses no shard
        settings = _with_environment("CONCORD_ES_NODES", str(es_nodes))
    if pg_replica and not settings.pg_replica_port:
        # The API then reads the query path from the replica.
        settings = _with_environment("CONCORD_PG_REPLICA_PORT", str(settings.pg_port + 1))
    try:
        stack.prepare_state_dir(settings)
        for svc in stack.services(settings, with_app=False):
            started = time.monotonic()
            svc.up()
            console.print(
                f"[green]up[/] {svc.name:<14} {svc.where()}  ({time.monotonic() - started:.1f}s)"
            )
        stack.migrate_and_prepare_indices(settings)
        console.print("[green]ok[/] schema migrated, Elasticsearch index ready")
        if not infra_only:
            api = next(p for p in stack.app_processes(settings) if p.name == "api")
            if not stack._pid_alive(api.pid()):
                stack._refuse_taken_port("api", settings.api_port)
            # The supervisor starts the app processes and restarts any that dies.
            stack.supervisor_process(settings).up()
            for proc in stack.app_processes(settings):
                proc.wait_healthy()
                console.print(f"[green]up[/] {proc.name:<14} {proc.where()}")
    except stack.StackError as e:
        print_error(console, e, label="error:")
        raise typer.Exit(1) from e
    console.print(f"state directory: {settings.state_path()}")


@app.command()
def down() -> None:
    """Stop exactly the processes this stack started (by their recorded PIDs)."""
    settings = get_settings()
    for svc in reversed(stack.services(settings, with_app=True)):
        svc.down()
        console.print(f"[yellow]down[/] {svc.name}")


@app.command()
def status() -> None:
    """Report each service up or down; exit 1 when any infrastructure service is down."""
    settings = get_settings()
    table = Table("service", "state", "pid", "restarts", "where")
    rows = stack.status(settings)
    for row in rows:
        table.add_row(
            row.name,
            "[green]up[/]" if row.up else "[red]down[/]",
            str(row.pid or "-"),
            "-" if row.restarts is None else str(row.restarts),
            row.where,
        )
    console.print(table)
    if not all(r.up for r in rows if stack.is_infra(r.name)):
        raise typer.Exit(1)
