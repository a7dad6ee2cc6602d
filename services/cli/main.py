"""The `concord` command line: stack, migrations, keys, ingest and search."""

from __future__ import annotations

import json
import sys
import uuid
from typing import TYPE_CHECKING

import httpx
import typer
from rich.markup import escape

from services.cli import (
    admin,
    answerability,
    documents,
    evaluate,
    reranker,
    stack_commands,
)
from services.cli.errors import api_error, run, set_debug, usage
from services.cli.output import cli_console
from shared.settings import get_settings

if TYPE_CHECKING:
    pass

app = typer.Typer(
    help="Concord: hybrid retrieval over Postgres/pgvector and Elasticsearch.",
    no_args_is_help=True,
    # errors are services/cli/errors.py's to print: one line each, tracebacks with --debug
    pretty_exceptions_enable=False,
)
app.add_typer(stack_commands.app, name="stack")
keys_app = typer.Typer(help="Create, list and revoke API keys.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")
app.add_typer(admin.dlq_app, name="dlq")
app.add_typer(admin.partitions_app, name="partitions")
app.add_typer(reranker.app, name="reranker")
app.add_typer(answerability.app, name="answerability")
app.command()(documents.ingest)
app.command()(documents.sync)
app.command()(admin.reconcile)
app.command()(admin.reindex)
app.command()(admin.reembed)
app.command()(admin.calibrate)
app.command()(admin.jobs)
app.command()(admin.stats)
app.command("eval")(evaluate.eval_command)
app.command("eval-docs")(evaluate.eval_docs_command)
app.command("tune")(evaluate.tune_command)
console = cli_console()
# The key, from the environment without ever showing it: no default the help would print.
API_KEY_OPTION = typer.Option(
    None,
    "--api-key",
    envvar="CONCORD_API_KEY",
    show_envvar=False,
    help="The tenant's key (from CONCORD_API_KEY when not given).",
)


@app.callback()
def options(
    debug: bool = typer.Option(
        False, "--debug", help="Print the traceback of an error after its one-line message."
    ),
) -> None:
    """Concord: hybrid retrieval over Postgres/pgvector and Elasticsearch."""
    set_debug(debug)


@app.command()
def migrate() -> None:
    """Apply database migrations and the Elasticsearch index setup (idempotent)."""
    from services.cli.stack import migrate_and_prepare_indices

    migrate_and_prepare_indices(get_settings())
    console.print("[green]ok[/] schema at head, Elasticsearch index ready")


@keys_app.command("create")
def keys_create(
    tenant: str = typer.Option(..., help="Tenant the key belongs to (created if new)."),
    scopes: str = typer.Option("read,write", help="Comma-separated: read, write, admin."),
    name: str = typer.Option("cli", help="A label for the key."),
) -> None:
    """Create an API key; the secret is printed once and never stored."""
    from shared.db import unit_of_work
    from shared.tenants.service import create_key

    with unit_of_work() as uow:
        key, secret = create_key(uow.session, tenant, name, [s.strip() for s in scopes.split(",")])
        key_id = key.id
    typer.echo(f"# key id {key_id}, tenant {tenant}", err=True)
    typer.echo(secret)


@keys_app.command("list")
def keys_list() -> None:
    """List keys (never their secrets)."""
    from shared.db import unit_of_work
    from shared.tenants.service import list_keys

    with unit_of_work() as uow:
        keys = [key.model_dump(mode="json") for key in list_keys(uow.session)]
    typer.echo(json.dumps(keys, indent=2))


@keys_app.command("revoke")
def keys_revoke(key_id: uuid.UUID = typer.Argument(..., help="The id `keys list` shows.")) -> None:
    """Revoke a key by id."""
    from shared.db import unit_of_work
    from shared.errors import NotFound
    from shared.tenants.service import revoke_key

    with unit_of_work() as uow:
        found = revoke_key(uow.session, key_id)
    if not found:
        raise NotFound(f"no key {key_id} (concord keys list shows the keys)")
    console.print(f"revoked {key_id}")


@app.command()
def search(
    query: str,
    top_k: int = typer.Option(5, "--top-k", "-k"),
    mode: str = typer.Option("hybrid", help="dense, lexical or hybrid"),
    api_key: str | None = API_KEY_OPTION,
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Search through the API and print the results."""
    if not api_key:
        raise usage(
            "an API key is needed: pass --api-key or set CONCORD_API_KEY "
            "(concord keys create --tenant T makes one)"
        )
    settings = get_settings()
    response = httpx.post(
        f"{settings.api_url()}/v1/search",
        timeout=60,
        headers={"Authorization": f"Bearer {api_key}"},
        json={"query": query, "top_k": top_k, "mode": mode},
    )
    if response.status_code != 200:
        raise api_error(response.status_code, response.text)
    body = response.json()
    if as_json:
        typer.echo(json.dumps(body, indent=2))
        return
    degraded = f", degraded: {', '.join(body['degraded'])}" if body["degraded"] else ""
    decision = body["decision"]
    verdict = decision["status"] + (f": {decision['reason']}" if decision["reason"] else "")
    console.print(f"[bold]{escape(query)}[/]  ({mode}{degraded}; {verdict})")
    for i, hit in enumerate(body["results"], start=1):
        snippet = " ".join(hit["text"].split())[:160]
        arms = escape(f"[{'+'.join(hit['found_by'])}]")
        console.print(
            f" {i}. [cyan]{hit['score']:.4f}[/] {arms} "
            f"{escape(hit['title'] or hit['external_id'])}: {escape(snippet)}"
        )


@app.command()
def mcp(
    stdio: bool = typer.Option(
        False, "--stdio", help="Serve MCP over stdin/stdout (how a desktop assistant runs it)."
    ),
    api_key: str | None = API_KEY_OPTION,
    url: str | None = typer.Option(
        None, "--url", help="The Concord API the tools call (default: this machine's API)."
    ),
) -> None:
    """The MCP server for AI assistants: search, read and add documents as one tenant. The
    API serves it at /mcp (Streamable HTTP) already; --stdio serves it to a desktop
    assistant that starts it as a process (docs/integrations.md)."""
    if not stdio:
        raise usage(
            f"the API serves MCP at {get_settings().api_url()}/mcp; run with --stdio to serve "
            "it over stdin/stdout instead"
        )
    if not api_key:
        raise usage("an API key is needed: pass --api-key or set CONCORD_API_KEY")
    from services.mcp.stdio import serve_stdio

    serve_stdio(url or get_settings().api_url(), api_key)


def main() -> None:
    """The `concord` console script: every error one line (services/cli/errors.py)."""
    sys.exit(run(app))


if __name__ == "__main__":
    main()
