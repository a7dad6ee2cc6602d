"""``concord reranker train | list | delete``: rerankers trained on a tenant's own judgements."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from evaluation.beir import DatasetError
from services.cli import tenants
from services.cli.evaluate import stage_progress
from services.cli.output import cli_console, print_error
from shared.errors import NotFound

console = cli_console()
app = typer.Typer(help="Train, list and delete rerankers.", no_args_is_help=True)


@app.command("train")
def train(
    dataset: Path = typer.Option(..., "--dataset", help="A BEIR-format dataset directory."),
    split: str = typer.Option("train", help="Judgements to train on (never the test split)."),
    name: str = typer.Option("trained", help="Name to register the reranker under."),
    base: str = typer.Option(None, "--base", help="Base model (default: packaged MiniLM)."),
    epochs: int = typer.Option(3, min=1, max=50),
    learning_rate: float = typer.Option(1e-4, "--lr", min=1e-7, max=1e-2),
    batch_size: int = typer.Option(16, min=1, max=512),
    max_length: int = typer.Option(256, min=16, max=512, help="Tokens per (query, passage)."),
    hard_negatives: int = typer.Option(4, min=0, max=50, help="Per query, from hybrid search."),
    random_negatives: int = typer.Option(1, min=0, max=50, help="Per query, random passages."),
    profile: str = typer.Option(None, help="Mine negatives with this search profile."),
    window: int = typer.Option(20, min=1, max=200, help="Rerank window for validation."),
    max_queries: int = typer.Option(None, min=2, help="Use only the first N judged queries."),
    max_steps: int = typer.Option(None, min=1, help="Stop after N optimizer steps."),
    seed: int = typer.Option(13),
    background: bool = typer.Option(
        False, "--background", help="Run as a job on the training queue; prints the job id."
    ),
) -> None:
    """Fine-tune a cross-encoder on the split's judgements and register it for the dataset's
    tenant (search with "rerank": {"enabled": true, "model": NAME})."""
    from training.fine_tuning import TrainingOptions
    from training.reranker import TrainingRefused, train_reranker

    options = TrainingOptions(
        split=split,
        base_model=base,
        epochs=epochs,
        learning_rate=learning_rate,
        batch_size=batch_size,
        max_length=max_length,
        hard_negatives=hard_negatives,
        random_negatives=random_negatives,
        profile=profile,
        rerank_window=window,
        max_queries=max_queries,
        max_steps=max_steps,
        seed=seed,
    )
    if background:
        from shared.stores.compose import connect
        from training.jobs import start_training_job

        try:
            job_id = start_training_job(dataset, name, options, queue=connect().queue)
        except (DatasetError, TrainingRefused) as e:
            print_error(console, e)
            raise typer.Exit(2) from e
        console.print(f"training job {job_id} queued; follow it with GET /v1/jobs/{job_id}")
        return
    try:
        with stage_progress() as progress:
            card = train_reranker(dataset, name, options, progress)
    except (DatasetError, TrainingRefused) as e:
        print_error(console, e)
        raise typer.Exit(2) from e
    console.print_json(data=card)


@app.command("validate")
def validate_command(
    dataset: Path = typer.Option(..., "--dataset", help="The dataset it was trained on."),
    name: str = typer.Option(..., help="The registered reranker."),
) -> None:
    """Validate a reranker again on its held-out queries; records the figures and the blend
    with the fused scores in its model card."""
    from training.fine_tuning import TrainingOptions
    from training.reranker import revalidate_reranker

    try:
        with stage_progress() as progress:
            card = revalidate_reranker(dataset, name, TrainingOptions(), progress)
    except (DatasetError, NotFound) as e:
        print_error(console, e)
        raise typer.Exit(2) from e
    console.print_json(data=card["validation"])


@app.command("list")
def list_(tenant: str | None = tenants.option()) -> None:
    """Registered rerankers of a tenant, with their model cards."""
    tenant = tenants.resolve(tenant)
    from shared.db import unit_of_work
    from shared.rerankers import service as rerankers

    with unit_of_work() as uow:
        entries = rerankers.list_for_tenant(uow.session, tenant)
        listed = [rerankers.reranker_view(e).model_dump(mode="json") for e in entries]
    typer.echo(json.dumps(listed, indent=2))


@app.command("delete")
def delete(name: str, tenant: str | None = tenants.option()) -> None:
    """Unregister a reranker and remove its files."""
    tenant = tenants.resolve(tenant)
    from shared.db import unit_of_work
    from shared.rerankers import service as rerankers

    try:
        with unit_of_work() as uow:
            path = rerankers.delete(uow.session, tenant, name)
    except NotFound as e:
        print_error(console, e)
        raise typer.Exit(1) from e
    rerankers.remove_files(path)
    console.print(f"deleted reranker {name} of tenant {tenant}")
