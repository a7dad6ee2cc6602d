"""The `concord` command line: stack, migrations, keys, ingest and search."""

from __future__ import annotations

import json
import sys
import uuid
from datetime import datetime
from pathlib import Path

import httpx
import typer
from rich.markup import escape
from rich.progress import Progress

from services.cli import admin, answerability, evaluate, reranker, stack_commands, tenants
from services.cli.errors import api_error, run, set_debug, usage
from services.cli.output import cli_console, print_error
from shared.settings import get_settings

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
def ingest(
    paths: list[Path] = typer.Argument(..., help="Files or directories to publish."),
    tenant: str | None = tenants.option(),
    prefix: str = typer.Option("", help="External ids are PREFIX + the path under each DIR."),
    wait: bool = typer.Option(
        False, "--wait", help="Wait until every document is indexed or has failed."
    ),
    timeout: float = typer.Option(600, help="Seconds to wait with --wait."),
) -> None:
    """Publish files (directories recursively) as upload events on the ingest queue. A file
    under a directory given is named PREFIX + its path relative to that directory (as sync
    names it), a file given itself PREFIX + its name: the same file is the same document
    whatever the directory the command runs from."""
    tenant = tenants.resolve(tenant)
    from shared.documents.events import EventBatcher, build_upload_event
    from shared.queue import publish_upload_events

    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        print_error(console, ", ".join(missing), label="not found:")
        raise typer.Exit(2)
    named: dict[str, Path] = {}
    for path in paths:
        if path.is_dir():
            for file in sorted(p for p in path.rglob("*") if p.is_file()):
                named[prefix + file.relative_to(path).as_posix()] = file
        else:
            named[prefix + path.name] = path
    published = failed = 0
    if wait:
        since, awaiting = _before_sending(tenant, named)
    batcher = EventBatcher(publish_upload_events)  # a few dozen events per message
    with Progress(console=console) as progress:
        task = progress.add_task("publishing", total=len(named))
        for external_id, file in named.items():
            try:
                event = build_upload_event(
                    tenant_id=tenant,
                    external_id=external_id,
                    raw=file.read_bytes(),
                    filename=file.name,
                    title=file.stem,
                )
                published += batcher.add(event)
            except OSError as e:
                failed += 1
                print_error(console, f"{file}: {e}", label="skipped")
            progress.advance(task)
        published += batcher.flush()
    console.print(f"published {published} upload event(s), {failed} failed, tenant {tenant}")
    if wait and published:
        failed += _wait_settled(tenant, list(named), timeout, since, awaiting)
    if failed:
        raise typer.Exit(1)


@app.command()
def sync(
    directory: Path = typer.Argument(..., help="The directory whose files the tenant should hold."),
    tenant: str | None = tenants.option(),
    prefix: str = typer.Option("", help="External ids are PREFIX + the path under DIRECTORY."),
    prune: bool = typer.Option(False, "--prune", help="Delete documents whose file is gone."),
    force: bool = typer.Option(
        False,
        "--force",
        help="With --prune: delete even when the directory is empty or more than half of the "
        "prefix's documents would go.",
    ),
    retry_failed: bool = typer.Option(
        False,
        "--retry-failed",
        help="Send again the files whose same content already failed (a failed job, or an "
        "upload refused at intake); without it they wait until they change.",
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show the plan; send nothing."),
    by_reference: bool = typer.Option(
        False,
        "--by-reference",
        help="Send paths under CONCORD_INGEST_CONTENT_ROOT (which must hold DIRECTORY) instead "
        "of the bytes.",
    ),
    wait: bool = typer.Option(
        False, "--wait", help="Wait until every sent file is indexed or has failed."
    ),
    timeout: float = typer.Option(600, help="Seconds to wait with --wait."),
) -> None:
    """Make the tenant's documents under PREFIX match DIRECTORY: send new and changed files
    (by content hash), and with --prune delete those whose file is gone. Idempotent: a second
    run sends nothing; an interrupted one resumes when run again. A file whose content already
    failed is not sent again until it changes (or with --retry-failed)."""
    tenant = tenants.resolve(tenant)
    from shared.db import unit_of_work
    from shared.db.repository import now
    from shared.documents import sync as syncing
    from shared.documents.events import EventBatcher, build_delete_event, build_upload_event
    from shared.queue import publish_upload_events
    from shared.tenants.service import validate_tenant_id

    if not directory.is_dir():
        print_error(console, f"{directory} is not a directory", label="sync:")
        raise typer.Exit(2)
    validate_tenant_id(tenant)
    if prefix and not prefix.endswith("/"):
        # "team1" + path would also match (and --prune delete) "team10/...": a prefix names a
        # directory of external ids.
        print_error(console, f"--prefix {prefix!r} must end with '/'", label="sync:")
        raise typer.Exit(2)
    root: Path | None = None
    if by_reference:
        configured = get_settings().ingest_content_root
        root = (Path(configured) / tenant).resolve()  # references are within the tenant's own
        if not configured or not directory.resolve().is_relative_to(root):
            print_error(
                console,
                f"{directory} is not under CONCORD_INGEST_CONTENT_ROOT/{tenant}",
                label="sync:",
            )
            raise typer.Exit(2)
    files = syncing.local_files(tenant, directory, prefix)
    with unit_of_work() as uow:
        todo = syncing.plan(uow.session, tenant, files, prefix, prune, retry_failed)
        since = now(uow.session)  # before anything is sent: what --wait counts from
    counts = todo.counts()
    held_back = counts["failed before"]
    console.print(
        f"plan for tenant {tenant}: {counts['new']} new, {counts['changed']} changed, "
        f"{counts['retry']} to retry, {counts['unchanged']} unchanged, "
        f"{held_back} failed before"
        + (" (not sent again until changed; --retry-failed sends them)" if held_back else "")
        + f", {counts['delete']} to delete"
        + ("" if prune else " (without --prune nothing is deleted)")
    )
    for label, names in (
        ("new", [f.external_id for f in todo.new]),
        ("changed", [f.external_id for f in todo.changed]),
        ("retry", [f.external_id for f in todo.retried]),
        ("failed", [f.external_id for f in todo.failed_before]),
        ("delete", todo.deletes),
    ):
        for name in names[:20]:
            console.print(f"  {label:<7} {escape(name)}")
        if len(names) > 20:
            console.print(f"  {label:<7} ... and {len(names) - 20} more")
    refusal = syncing.prune_refusal(todo, bool(files)) if prune and not force else None
    if refusal:
        print_error(console, f"{refusal}; nothing sent (--force deletes anyway)", label="sync:")
        if not dry_run:
            raise typer.Exit(2)
    if dry_run or not todo.to_send():
        console.print("dry run: nothing sent" if dry_run else "in sync: nothing to send")
        return
    batcher = EventBatcher(publish_upload_events)
    sent = 0
    with Progress(console=console) as progress:
        task = progress.add_task("sending", total=todo.to_send())
        for f in todo.uploads():
            upload = syncing.file_upload(tenant, f.path, f.external_id)
            reference = None
            if root is not None:
                if f.path.is_symlink() or not f.path.resolve().is_relative_to(root):
                    print_error(console, f"{f.path}: a link; sent inline", label="sync:")
                else:
                    reference = f.path.resolve().relative_to(root).as_posix()
            sent += batcher.add(
                build_upload_event(
                    tenant_id=tenant,
                    external_id=f.external_id,
                    raw=None if reference else upload.raw,
                    content_path=reference,
                    content_type=upload.content_type,
                    filename=upload.filename,
                    title=upload.title,
                )
            )
            progress.advance(task)
        for external_id in todo.deletes:
            sent += batcher.add(build_delete_event(tenant_id=tenant, external_id=external_id))
            progress.advance(task)
        sent += batcher.flush()
    console.print(f"sent {sent} event(s) to tenant {tenant}")
    if wait:
        sent_ids = [f.external_id for f in todo.uploads()]
        if sent_ids and _wait_settled(tenant, sent_ids, timeout, since, sent_ids):
            raise typer.Exit(1)


def _before_sending(tenant: str, named: dict[str, Path]) -> tuple[datetime, list[str]]:
    """What ``ingest --wait`` needs before it publishes: the database's time, and the uploads
    that will make a job (the others are unchanged: their document's job is their answer)."""
    from shared.db import unit_of_work
    from shared.db.repository import now
    from shared.documents import sync as syncing

    files = []
    for external_id, path in named.items():
        try:
            files.append(syncing.local_file(tenant, path, external_id))
        except OSError:
            continue  # not sent: the publishing loop reports it
    with unit_of_work() as uow:
        plan = syncing.plan(
            uow.session, tenant, files, "", prune=False, retry_failed=True, only_files=True
        )
        return now(uow.session), [f.external_id for f in plan.uploads()]


def _wait_settled(
    tenant: str, external_ids: list[str], timeout: float, since: datetime, awaiting: list[str]
) -> int:
    """Show indexing progress until every document is indexed or has failed (a job failed or
    dead-lettered, or the upload refused at intake), then name each failure with its reason;
    returns how many documents are not indexed (failed, or not finished within ``timeout``).
    ``since``: the database's time before sending; ``awaiting``: the uploads that make a job
    (shared/jobs/repository.upload_outcomes)."""
    import time

    from shared.db import unit_of_work
    from shared.jobs.repository import upload_outcomes

    final = {"indexed", "failed", "dead_lettered"}
    deadline = time.monotonic() + timeout
    outcomes: dict[str, tuple[str, str | None]] = {}
    with Progress(console=console) as progress:
        task = progress.add_task("indexing", total=len(external_ids))
        while True:
            with unit_of_work() as uow:
                outcomes = upload_outcomes(uow.session, tenant, external_ids, since, awaiting)
            settled = sum(1 for state, _ in outcomes.values() if state in final)
            progress.update(task, completed=settled)
            if settled == len(external_ids) or time.monotonic() >= deadline:
                break
            time.sleep(0.5)
    indexed = failed = 0
    for external_id in external_ids:
        state, reason = outcomes.get(external_id, ("not yet accepted", None))
        if state == "indexed":
            indexed += 1
            continue
        failed += state in ("failed", "dead_lettered")
        why = f": {reason}" if reason else f" (not finished in {timeout:g} s)"
        print_error(console, f"{escape(external_id)}{why}", label=state)
    pending = len(external_ids) - indexed - failed
    console.print(
        f"indexed {indexed} of {len(external_ids)}, {failed} failed"
        + (f", {pending} not finished in {timeout:g} s" if pending else "")
    )
    return failed + pending


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
