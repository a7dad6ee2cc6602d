"""Sending documents from the command line: ``concord ingest`` (files as upload events) and
``concord sync`` (a directory mirrored into a tenant, idempotently)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.markup import escape
from rich.progress import Progress

from services.cli import tenants
from services.cli.output import cli_console, print_error
from shared.settings import get_settings

if TYPE_CHECKING:
    from shared.documents.sync import SyncPlan


console = cli_console()


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
    from shared.stores.compose import connect

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
    batcher = EventBatcher(connect().queue.publish_upload_events)  # a few dozen events a message
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
    from shared.tenants.service import validate_tenant_id

    validate_tenant_id(tenant)
    root = _sync_arguments(directory, tenant, prefix, by_reference)
    files = syncing.local_files(tenant, directory, prefix)
    with unit_of_work() as uow:
        todo = syncing.plan(uow.session, tenant, files, prefix, prune, retry_failed)
        since = now(uow.session)  # before anything is sent: what --wait counts from
    _print_sync_plan(tenant, todo, prune)
    refusal = syncing.prune_refusal(todo, bool(files)) if prune and not force else None
    if refusal:
        print_error(console, f"{refusal}; nothing sent (--force deletes anyway)", label="sync:")
        if not dry_run:
            raise typer.Exit(2)
    if dry_run or not todo.to_send():
        console.print("dry run: nothing sent" if dry_run else "in sync: nothing to send")
        return
    sent = _send_sync_events(tenant, todo, root)
    console.print(f"sent {sent} event(s) to tenant {tenant}")
    if wait:
        sent_ids = [f.external_id for f in todo.uploads()]
        if sent_ids and _wait_settled(tenant, sent_ids, timeout, since, sent_ids):
            raise typer.Exit(1)


def _sync_arguments(directory: Path, tenant: str, prefix: str, by_reference: bool) -> Path | None:
    """Exit 2 on a directory, prefix or content root that cannot work; the tenant's content
    root when files are sent by reference."""
    if not directory.is_dir():
        print_error(console, f"{directory} is not a directory", label="sync:")
        raise typer.Exit(2)
    if prefix and not prefix.endswith("/"):
        # "team1" + path would also match (and --prune delete) "team10/...": a prefix names a
        # directory of external ids.
        print_error(console, f"--prefix {prefix!r} must end with '/'", label="sync:")
        raise typer.Exit(2)
    if not by_reference:
        return None
    configured = get_settings().ingest_content_root
    root = (Path(configured) / tenant).resolve()  # references are within the tenant's own
    if not configured or not directory.resolve().is_relative_to(root):
        print_error(
            console, f"{directory} is not under CONCORD_INGEST_CONTENT_ROOT/{tenant}", label="sync:"
        )
        raise typer.Exit(2)
    return root


def _print_sync_plan(tenant: str, todo: SyncPlan, prune: bool) -> None:
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


def _send_sync_events(tenant: str, todo: SyncPlan, root: Path | None) -> int:
    """The plan's uploads (by reference under ``root``, if given) and deletes, as events in
    batches, with a progress bar; how many were sent."""
    from shared.documents import sync as syncing
    from shared.documents.events import EventBatcher, build_delete_event, build_upload_event
    from shared.stores.compose import connect

    batcher = EventBatcher(connect().queue.publish_upload_events)
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
        return sent + batcher.flush()


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
