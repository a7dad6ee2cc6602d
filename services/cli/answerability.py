"""``concord answerability train | list | delete``: answerability models learned from a
tenant's own judgements (see training/answerability.py)."""

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
app = typer.Typer(help="Train, list and delete answerability models.", no_args_is_help=True)


@app.command("train")
def train(
    dataset: Path = typer.Option(..., "--dataset", help="A BEIR-format dataset directory."),
    split: str = typer.Option("train", help="Judgements to train on (never the test split)."),
    name: str = typer.Option("default", help="Name to register the model under."),
    max_false_abstain: float = typer.Option(
        0.05, min=0.0, max=0.5, help="Abstain threshold: at most this share of false abstains."
    ),
    max_queries: int = typer.Option(None, min=5, help="Use only the first N judged queries."),
    seed: int = typer.Option(13),
    reranker: str = typer.Option(
        None,
        help="Also read this trained reranker's scores of the first results (trains on the "
        "judged queries the reranker never saw: train it with --max-queries to leave some).",
    ),
) -> None:
    """Learn from the split's judgements when the dataset's tenant cannot answer a query, and
    register the model (search with "policy": {"score_type": "answerability"})."""
    from training.answerability import AnswerabilityOptions, train_answerability
    from training.reranker import TrainingRefused

    options = AnswerabilityOptions(split, max_queries, max_false_abstain, seed, reranker)
    try:
        with stage_progress() as progress:
            card = train_answerability(dataset, name, options, progress)
    except (DatasetError, TrainingRefused, NotFound) as e:
        print_error(console, e)
        raise typer.Exit(2) from e
    console.print_json(data=card)


@app.command("list")
def list_(tenant: str | None = tenants.option()) -> None:
    """Registered answerability models of a tenant, with their thresholds and model cards."""
    tenant = tenants.resolve(tenant)
    from shared.answerability import service as registry
    from shared.db import unit_of_work

    with unit_of_work() as uow:
        entries = registry.list_for_tenant(uow.session, tenant)
        listed = [registry.model_view(e).model_dump(mode="json") for e in entries]
    typer.echo(json.dumps(listed, indent=2))


@app.command("delete")
def delete(name: str, tenant: str | None = tenants.option()) -> None:
    """Unregister an answerability model."""
    tenant = tenants.resolve(tenant)
    from shared.answerability import service as registry
    from shared.db import unit_of_work

    try:
        with unit_of_work() as uow:
            registry.delete(uow.session, tenant, name)
    except NotFound as e:
        print_error(console, e)
        raise typer.Exit(1) from e
    console.print(f"deleted answerability model {name} of tenant {tenant}")
