"""Operator commands: reconcile, jobs, dead letters, stats."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import typer
from rich.table import Table

from services.cli import tenants
from services.cli.output import cli_console, print_error

console = cli_console()
dlq_app = typer.Typer(help="List, show, replay or discard dead letters.", no_args_is_help=True)
partitions_app = typer.Typer(
    help="Where tenants' chunks live in Postgres: the shared partition or one of their own."
)


def reconcile(
    tenant: str | None = typer.Option(None, help="One tenant (default: every tenant)."),
    dry_run: bool = typer.Option(
        True, "--dry-run/--repair", help="Only report (default), or repair and verify."
    ),
    deep: bool = typer.Option(
        False, "--deep", help="Compare every chunk, not only buckets whose sums differ."
    ),
    wait: bool = typer.Option(
        True,
        "--wait/--no-wait",
        help="With --repair: wait for the repairs to land before comparing again (default).",
    ),
    timeout: float = typer.Option(
        120, help="Seconds to wait for repairs (Elasticsearch may hold one up to 60 s)."
    ),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Compare Postgres and Elasticsearch; exit 1 while drift remains."""
    from shared.db import unit_of_work
    from shared.reconcile.service import reconcile as run
    from shared.reconcile.service import reconcile_and_verify
    from shared.stores.compose import connect

    stores = connect()

    def progress(tenant: str, done: int, total: int) -> None:
        # stderr, so that --json output stays one parseable document
        typer.echo(f"{tenant}: {done}/{total} buckets compared", err=True)

    if dry_run:
        report = run(stores, unit_of_work, tenant, repair=False, deep=deep, progress=progress)
        body: dict[str, Any] = {"mode": "dry-run", **report.as_dict()}
        remaining = report.total()
    else:
        found, after = reconcile_and_verify(
            stores,
            unit_of_work,
            tenant,
            deep=deep,
            progress=progress,
            wait_s=timeout if wait else 0.0,
            waiting=_every_five_seconds(),
        )
        body = {"mode": "repair", **found.as_dict(), "after_repair": after.as_dict()}
        remaining = after.total()
    if as_json:
        typer.echo(json.dumps(body, indent=2))
    else:
        _print_report(body)
    if remaining:
        raise typer.Exit(1)


def _every_five_seconds() -> Callable[[int, int, float], None]:
    """A line on stderr every 5 s while repairs have not landed."""
    printed = [-5.0]

    def waiting(pending: int, total: int, seconds: float) -> None:
        if seconds - printed[0] >= 5:
            printed[0] = seconds
            typer.echo(
                f"{pending} of {total} repairs not landed yet ({seconds:.0f} s; "
                "Elasticsearch holds a repair of a chunk deleted behind its back)",
                err=True,
            )

    return waiting


def _print_report(body: dict[str, Any]) -> None:
    table = Table("class", "count", "sample ids")
    for name, count in body["counts"].items():
        table.add_row(name, str(count), ", ".join(body["samples"][name][:3]))
    console.print(table)
    console.print(
        f"total drift {body['total_drift']}; in flight {body['in_flight']} (writes still "
        "waiting in the outbox: not drift, not repaired)"
    )
    console.print(
        f"{body['tenants']} tenant(s), {body['buckets_differing']} of "
        f"{body['buckets_scanned']} buckets differed, {body['ids_read']} chunk ids read, "
        f"{body['duration_s']}s"
    )
    if "after_repair" in body:
        after = body["after_repair"]
        console.print(
            f"queued {body['repairs_queued']} repairs; drift after repair: {after['total_drift']}"
        )


def reindex(
    tenant: str | None = typer.Option(
        None, help="Rebuild one tenant's index only (default: every tenant's)."
    ),
) -> None:
    """Rebuild the Elasticsearch index from Postgres behind the alias and switch atomically
    (resumes an interrupted run); then report any drift."""
    from rich.progress import Progress

    from shared.db import unit_of_work
    from shared.errors import NotFound
    from shared.reconcile.reindex import ReindexRunning
    from shared.reconcile.reindex import reindex as run
    from shared.reconcile.service import reconcile as check
    from shared.stores.chunk_index import ReindexCopyRefused
    from shared.stores.compose import connect
    from shared.tenants.repository import tenant_exists

    stores = connect()

    if tenant is not None:
        with unit_of_work() as uow:
            if not tenant_exists(uow.session, tenant):
                raise NotFound(f"there is no tenant {tenant!r}; check the name")
    try:
        with Progress(console=console) as bar:
            task = bar.add_task("copying chunks", total=None)
            result = run(
                stores,
                unit_of_work,
                lambda done, total: bar.update(task, completed=done, total=total),
                notice=console.print,
                tenant_id=tenant,
            )
    except (ReindexRunning, ReindexCopyRefused) as e:
        print_error(console, e, label="error:")
        raise typer.Exit(1) from e
    console.print(
        f"{'resumed and ' if result.resumed else ''}copied {result.copied} chunks"
        f"{f' of tenant {tenant}' if tenant else ''} into generation {result.new_index} in "
        f"{result.seconds:.1f}s; removed {len(result.old_indices)} indices"
    )
    drift = check(stores, unit_of_work, tenant, repair=False)
    console.print(f"drift after the switch: {drift.total()}")
    if drift.total():
        raise typer.Exit(1)


def reembed(
    tenant: str | None = tenants.option(),
    wait: bool = typer.Option(False, "--wait", help="Wait until every job is indexed again."),
    timeout: float = typer.Option(3600, help="Seconds to wait with --wait."),
) -> None:
    """Run the tenant's live documents through the pipeline again (after a change to
    CONCORD_CHUNK_CONTEXT, the chunking or the model): chunks are rewritten at their version;
    what is unchanged comes from the embedding cache."""
    tenant = tenants.resolve(tenant)
    import time

    from shared.db import unit_of_work
    from shared.jobs import service as job_service
    from shared.jobs.repository import job_states
    from shared.settings import get_settings
    from shared.stores.compose import connect

    job_ids = job_service.reprocess_tenant(
        unit_of_work, tenant, get_settings(), queue=connect().queue
    )
    console.print(f"queued {len(job_ids)} job(s) of tenant {tenant} again")
    if not wait or not job_ids:
        return
    from rich.progress import Progress

    deadline = time.monotonic() + timeout
    with Progress(console=console) as bar:
        task = bar.add_task("reembedding", total=len(job_ids))
        while time.monotonic() < deadline:
            with unit_of_work() as uow:
                states = job_states(uow.session, job_ids)
            done = sum(1 for s in states.values() if s in job_service.FINISHED)
            bar.update(task, completed=done)
            if done == len(job_ids):
                break
            time.sleep(1)
    failed = sum(1 for s in states.values() if s != "indexed")
    console.print(f"reembedded {len(job_ids) - failed} of {len(job_ids)}")
    if failed:
        raise typer.Exit(1)


def calibrate(
    tenant: str | None = tenants.option(),
) -> None:
    """Set the tenant's dense-score threshold for the default decision from its own corpus:
    between questions drawn from its chunks and everyday questions far from it (beat does
    this by itself for tenants whose corpus changed)."""
    tenant = tenants.resolve(tenant)
    from shared.db import unit_of_work
    from shared.search.calibration import MIN_SAMPLES, calibrate
    from shared.settings import get_settings
    from shared.stores.compose import connect

    result = calibrate(connect(), unit_of_work, tenant, get_settings())
    if result is None:
        print_error(
            console, f"tenant {tenant!r} has too few chunks to draw {MIN_SAMPLES} questions from"
        )
        raise typer.Exit(1)
    console.print_json(data=dataclasses.asdict(result))
    if result.min_score is None:
        console.print(
            "its own questions and the far ones overlap: the default threshold "
            f"(CONCORD_POLICY_MIN_SCORE={get_settings().policy_min_score}) stays"
        )


@partitions_app.callback(invoke_without_command=True)
def partitions_list(ctx: typer.Context) -> None:
    """List the partitions of the chunks table, their chunks and whether they have a graph."""
    if ctx.invoked_subcommand is not None:
        return
    from shared.db import unit_of_work
    from shared.stores import partitions

    table = Table("tenant", "partition", "chunks", "graph")
    for view in partitions.describe(unit_of_work):
        table.add_row(view.tenant_id or "(shared)", view.partition, str(view.chunks), view.graph)
    console.print(table)


@partitions_app.command("place")
def partitions_place(
    tenant: str | None = typer.Option(
        None, help="Move this tenant whatever its size (default: every tenant past the threshold)."
    ),
) -> None:
    """Give tenants past CONCORD_TENANT_PARTITION_MIN_CHUNKS a partition and HNSW graph of
    their own now (the beat does it every CONCORD_PARTITION_INTERVAL_SECONDS)."""
    from shared.db import unit_of_work
    from shared.errors import NotFound
    from shared.stores import partitions

    try:
        placement = partitions.place_tenants(unit_of_work, tenant_id=tenant, progress=console.print)
    except NotFound as e:
        print_error(console, e, label="error:")
        raise typer.Exit(2) from e
    if placement.skipped:
        console.print("another placement run is under way; try again when it ends")
        raise typer.Exit(1)
    if placement.busy:
        console.print(f"writes kept these tenants from moving, try again: {placement.busy}")
        raise typer.Exit(1)
    if not placement.moved and not placement.graphs_built:
        console.print("nothing to place")


def jobs(
    state: str | None = typer.Option(None, help="queued, running, indexed, failed, dead_lettered"),
    stuck: bool = typer.Option(False, help="Only queued or running jobs whose lease expired."),
    tenant: str | None = typer.Option(None),
    limit: int = typer.Option(50),
) -> None:
    """Inspect ingest jobs."""
    from shared.admin.service import list_jobs
    from shared.db import unit_of_work

    with unit_of_work() as uow:
        rows = list_jobs(uow.session, state=state, stuck=stuck, tenant_id=tenant, limit=limit)
    table = Table("job", "tenant", "document", "v", "state", "attempts", "error", "created")
    for job in rows:
        table.add_row(
            str(job.id),
            job.tenant_id,
            job.external_id or str(job.document_id),
            str(job.version),
            job.state,
            str(job.attempts),
            (job.error or "")[:60],
            job.created_at.isoformat(timespec="seconds"),
        )
    console.print(table)


@dlq_app.command("list")
def dlq_list(
    tenant: str | None = typer.Option(None, help="Only this tenant's dead letters."),
    limit: int = typer.Option(50, help="The newest LIMIT."),
) -> None:
    """The newest dead letters: jobs that used up their attempts, Elasticsearch writes
    refused, upload events refused at intake; each with its stage and error."""
    from shared.admin.service import list_dead_letters
    from shared.db import unit_of_work

    with unit_of_work() as uow:
        rows = list_dead_letters(uow.session, tenant_id=tenant, limit=limit)
    from shared.jobs.service import dead_letter_view

    table = Table("id", "tenant", "source", "ref", "stage", "error", "attempts", "what to do")
    for d in (dead_letter_view(row) for row in rows):
        table.add_row(
            str(d.id),
            d.tenant_id,
            d.source,
            d.ref,
            d.stage,
            f"{d.error_class}: {d.message[:200]}",
            str(d.attempts),
            f"concord dlq replay {d.id}" if d.replayable else "corrected upload, or discard",
        )
    console.print(table)


@dlq_app.command("show")
def dlq_show(letter_id: int = typer.Argument(..., help="The id `dlq list` shows.")) -> None:
    """One dead letter whole, as JSON: its error, attempts and what it refers to."""
    from shared.admin.service import get_dead_letter
    from shared.db import unit_of_work
    from shared.jobs.service import dead_letter_view

    with unit_of_work() as uow:
        letter = dead_letter_view(get_dead_letter(uow.session, letter_id))
    typer.echo(letter.model_dump_json(indent=2))


@dlq_app.command("replay")
def dlq_replay(letter_id: int = typer.Argument(..., help="The id `dlq list` shows.")) -> None:
    """Re-run the dead-lettered job (or re-queue the Elasticsearch write) after a fix; an
    upload refused at intake cannot be replayed (its fix is a corrected upload)."""
    from shared.admin.service import replay_dead_letter
    from shared.db import unit_of_work
    from shared.stores.compose import connect

    with unit_of_work() as uow:
        what = replay_dead_letter(uow, letter_id, queue=connect().queue)
    console.print(f"replayed dead letter {letter_id}: {what}")


@dlq_app.command("discard")
def dlq_discard(letter_id: int = typer.Argument(..., help="The id `dlq list` shows.")) -> None:
    """Put a dead letter away without running it again: hidden from lists and counts, and
    a refused file is not sent again by sync until it changes."""
    from shared.admin.service import discard_dead_letter
    from shared.db import unit_of_work

    with unit_of_work() as uow:
        discard_dead_letter(uow.session, letter_id)
    console.print(f"discarded dead letter {letter_id}")


def stats(
    tenant: str | None = typer.Option(None, help="Count this tenant's only (queues are shared)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Documents, versions, chunks per store, outbox backlog, dead letters, last reconcile."""
    from shared.admin.service import system_stats
    from shared.db import unit_of_work
    from shared.stores.compose import connect

    stats_ = system_stats(connect(), unit_of_work, tenant)
    if as_json:
        typer.echo(stats_.model_dump_json(indent=2))
        return
    for key, value in stats_.model_dump(mode="json").items():
        console.print(f"{key:<22} {value}")
