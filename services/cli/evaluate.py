"""``concord eval`` and ``concord tune``: measure retrieval quality on a BEIR-format dataset
and tune a search profile on its train judgements."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)

from evaluation.beir import DatasetError
from services.cli.output import cli_console, print_error
from shared.errors import NotFound

console = cli_console()
progress_console = cli_console(stderr=True)  # progress on stderr: stdout stays the result


@contextmanager
def stage_progress() -> Iterator[Callable[[str, int, int], None]]:
    """A progress bar per stage; the harness reports (stage, done, total)."""
    with Progress(
        TextColumn("{task.description:<28}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=progress_console,
    ) as bars:
        tasks: dict[str, TaskID] = {}

        def report(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bars.add_task(stage, total=total)
            bars.update(tasks[stage], completed=done, total=total)

        yield report


def eval_command(
    dataset: Path = typer.Option(..., "--dataset", help="A BEIR-format dataset directory."),
    split: str = typer.Option("test", help="Which qrels/<split>.tsv to evaluate."),
    out: Path = typer.Option(Path("bench/results/eval"), help="Where the report goes."),
    profile: str = typer.Option(None, help="Also evaluate this search profile (e.g. from tune)."),
    depth: int = typer.Option(150, help="Candidate depth per arm."),
    rerank: bool = typer.Option(True, help="Also run every configuration with the rerank stage."),
    rerank_window: int = typer.Option(20, help="Candidates the rerank stage rescores."),
    reranker: str = typer.Option(
        None, help="Also run every configuration with this trained reranker (concord reranker)."
    ),
    answerability: str = typer.Option(
        None, help='Compare this answerability model (default: the tenant\'s "default" if any).'
    ),
    peer: bool = typer.Option(True, help="Run the Haystack peer in the same invocation."),
    abstain: bool = typer.Option(True, help="Measure abstain accuracy (unanswerable variant)."),
    seed: int = typer.Option(13, help="Seed for choosing the unanswerable half."),
    max_queries: int = typer.Option(None, help="Evaluate only the first N judged queries."),
    only: str = typer.Option("", help="Comma-separated configurations to run (default: all)."),
) -> None:
    """Evaluate retrieval quality and latency through the running stack (concord stack up)."""
    from evaluation.harness import EvalOptions, run_eval

    if split != "test" and profile:
        console.print(
            f"[yellow]note:[/] evaluating on the {split} split; if the profile was tuned on "
            "it, its figures are optimistic"
        )
    options = EvalOptions(
        split=split,
        depth=depth,
        rerank=rerank,
        rerank_window=rerank_window,
        profile=profile,
        reranker=reranker,
        answerability=answerability,
        peer=peer,
        abstain=abstain,
        seed=seed,
        max_queries=max_queries,
        only=tuple(name.strip() for name in only.split(",") if name.strip()),
    )
    try:
        with stage_progress() as progress:
            paths = run_eval(dataset, out, options, progress)
    except (DatasetError, NotFound) as e:
        print_error(console, e)
        raise typer.Exit(2) from e
    console.print(paths["markdown"].read_text())
    for kind, path in paths.items():
        console.print(f"{kind}: {path}")


def eval_docs_command(
    directory: Path = typer.Argument(
        Path("evaluation/devsets/real-docs"),
        help="A set of real documents: files/ and questions.jsonl.",
    ),
    out: Path = typer.Option(Path("bench/results/real-docs"), help="Where the figures go."),
    tenant: str = typer.Option("eval-real-docs", help="The tenant the documents go into."),
) -> None:
    """Index a set of real documents through the running stack and measure the default
    search on its questions: the answer's chunk in the first 5, the decision on answerable,
    near-topic and off-topic questions, stubs and repeats among the results."""
    from evaluation.real_docs import DevSetError, run_devset

    try:
        with stage_progress() as progress:
            summary = run_devset(directory, out, progress, tenant)
    except DevSetError as e:
        print_error(console, e)
        raise typer.Exit(2) from e
    console.print_json(data=summary)
    console.print(f"per question: {out / 'questions.jsonl'}")


def tune_command(
    dataset: Path = typer.Option(..., "--dataset", help="A BEIR-format dataset directory."),
    split: str = typer.Option("train", help="Judgements to tune on (never the test split)."),
    name: str = typer.Option("tuned", help="Name of the search profile to write."),
    max_queries: int = typer.Option(None, help="Tune on only the first N judged queries."),
) -> None:
    """Search fusion, weights, RRF k, depths, field boosts and the evidence threshold on the
    split's judgements; write the best as a named search profile of the dataset's tenant."""
    from evaluation.tune import TuningRefused, tune

    try:
        with stage_progress() as progress:
            result = tune(dataset, split, name, progress, max_queries)
    except (DatasetError, TuningRefused) as e:
        print_error(console, e)
        raise typer.Exit(2) from e
    console.print_json(data=result)
