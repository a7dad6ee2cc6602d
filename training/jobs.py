"""Reranker training as a background job: a ``training_jobs`` row in Postgres (state, progress,
ETA, the model card or the error) and a task on the ``training`` queue.

The task is acknowledged when it starts, not when it ends: a training run takes far longer
than the broker's visibility timeout, and a redelivered message would start a second run of
the same training next to the first. A worker that dies mid-run leaves the row ``running``
with a stale heartbeat: the sweep (shared/jobs/sweep.py) fails it once it has been silent
for ``TRAINING_LOST_AFTER``, with a ``training.failed`` webhook, and publishes a queued job
whose message was lost again."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from evaluation import beir
from evaluation.harness import eval_tenant
from shared.db import unit_of_work
from shared.db.repository import now
from shared.models import TrainingJob
from shared.queue import TaskQueue
from shared.text import storable_text
from shared.webhooks import service as webhooks
from training import repository as repo
from training.fine_tuning import TrainingOptions
from training.reranker import refuse_test_split, train_reranker

log = logging.getLogger(__name__)
HEARTBEAT_S = 10.0


def start_training_job(
    dataset_dir: Path, name: str, options: TrainingOptions, *, queue: TaskQueue
) -> uuid.UUID:
    """Check the request here (a bad dataset fails now, not in the worker), then queue it."""
    refuse_test_split(options.split)
    dataset = beir.load(dataset_dir)
    dataset.qrels(options.split)
    job_id = uuid.uuid4()
    params = {"dataset": str(dataset_dir.resolve()), "name": name, "options": asdict(options)}
    with unit_of_work() as uow:
        repo.add_training_job(
            uow.session,
            TrainingJob(
                id=job_id,
                tenant_id=eval_tenant(dataset),
                name=name,
                state="queued",
                params=params,
                progress={},
            ),
        )
    queue.publish_training_job(job_id)
    return job_id


def run_training_job(job_id: uuid.UUID, *, queue: TaskQueue) -> dict[str, Any]:
    with unit_of_work() as uow:
        # Locked: the sweep may have published a queued job again, and two messages taken at
        # once must not both start it.
        job = repo.training_job(uow.session, job_id, lock=True)
        if job is None or job.state != "queued":
            return {"job_id": str(job_id), "skipped": "not queued"}
        job.state = "running"
        job.updated_at = now(uow.session)
        params = job.params
    last_beat = 0.0

    def progress(stage: str, done: int, total: int) -> None:
        nonlocal last_beat
        if time.monotonic() - last_beat < HEARTBEAT_S and done < total:
            return
        last_beat = time.monotonic()
        with unit_of_work() as uow:
            row = repo.training_job(uow.session, job_id)
            if row is not None:
                stages = dict(row.progress.get("stages", {}))
                stages[stage] = {"done": done, "total": total}
                row.progress = {"stage": stage, "stages": stages}
                row.updated_at = now(uow.session)

    try:
        with _heartbeat(job_id):
            card = train_reranker(
                Path(params["dataset"]),
                params["name"],
                TrainingOptions(**params["options"]),
                progress,
            )
    except Exception as e:
        error = storable_text(f"{type(e).__name__}: {e}"[:2000])
        _finish(job_id, "failed", queue=queue, error=error)
        raise
    _finish(job_id, "done", queue=queue, result=card)
    return {"job_id": str(job_id), "state": "done"}


@contextmanager
def _heartbeat(job_id: uuid.UUID) -> Iterator[None]:
    """The run's heartbeat, from a thread of its own every ``HEARTBEAT_S`` for as long as the
    run lasts, whatever it is doing: some phases report no progress for long (waiting for
    Elasticsearch, a graph build), and the sweep fails a job silent for TRAINING_LOST_AFTER."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(HEARTBEAT_S):
            try:
                with unit_of_work() as uow:
                    repo.touch_running_training_job(uow.session, job_id)
            except Exception as e:  # the next beat tries again (see shared/jobs/sweep.py)
                log.warning("training job %s: heartbeat not written: %s", job_id, e)

    thread = threading.Thread(target=beat, name=f"training-heartbeat-{job_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _finish(
    job_id: uuid.UUID,
    state: str,
    *,
    queue: TaskQueue,
    result: dict[str, Any] | None = None,
    error: str | None = None,
) -> None:
    with unit_of_work() as uow:
        job = repo.training_job(uow.session, job_id, lock=True)
        if job is None or job.state != "running":  # deleted, or settled by the sweep meanwhile
            log.warning("training job %s ended %s but was no longer running", job_id, state)
            return
        job.state, job.result, job.error = state, result, error
        job.updated_at = now(uow.session)
        webhooks.training_finished(uow, job, queue=queue)
