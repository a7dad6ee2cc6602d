"""The task queue in memory: each queue a list of (task name, arguments) that nothing
consumes, which a unit test reads (``waiting``); requests for a run debounced as the Redis
transport's are (one waits until its run starts, or until PENDING_REQUEST_TTL_S has passed)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from shared.queue import (
    ACCEPT_EVENTS_TASK,
    CALIBRATE_SETTLED_TASK,
    INGEST_QUEUE,
    PENDING_REQUEST_TTL_S,
    PROCESS_JOB_TASK,
    PROCESS_JOBS_TASK,
    QUEUES,
    RELAY_QUEUE,
    RELAY_TASK,
    TRAIN_RERANKER_TASK,
    TRAINING_QUEUE,
    WEBHOOKS_QUEUE,
    WEBHOOKS_TASK,
)


class MemoryQueue:
    def __init__(self) -> None:
        self.waiting: dict[str, list[tuple[str, list[Any]]]] = {q: [] for q in QUEUES}
        self._pending_until: dict[str, float] = {}  # a run's task -> when its request lapses

    def warm_up(self) -> None:
        pass  # nothing to connect to

    def publish_ingest_job(self, job_id: uuid.UUID) -> bool:
        return self._send(PROCESS_JOB_TASK, [str(job_id)], INGEST_QUEUE)

    def publish_ingest_jobs(self, job_ids: Sequence[uuid.UUID]) -> bool:
        return self._send(PROCESS_JOBS_TASK, [[str(j) for j in job_ids]], INGEST_QUEUE)

    def publish_training_job(self, job_id: uuid.UUID) -> None:
        self._send(TRAIN_RERANKER_TASK, [str(job_id)], TRAINING_QUEUE)

    def publish_upload_events(self, events: list[dict[str, Any]]) -> None:
        self._send(ACCEPT_EVENTS_TASK, [events], INGEST_QUEUE)

    def publish_relay(self) -> bool:
        return self._debounced(RELAY_TASK, RELAY_QUEUE)

    def relay_started(self) -> None:
        self._pending_until.pop(RELAY_TASK, None)

    def publish_webhooks(self) -> bool:
        return self._debounced(WEBHOOKS_TASK, WEBHOOKS_QUEUE)

    def webhooks_started(self) -> None:
        self._pending_until.pop(WEBHOOKS_TASK, None)

    def publish_calibration(self) -> bool:
        return self._debounced(CALIBRATE_SETTLED_TASK, TRAINING_QUEUE)

    def calibration_started(self) -> None:
        self._pending_until.pop(CALIBRATE_SETTLED_TASK, None)

    def queue_depths(self) -> dict[str, int]:
        return {q: len(messages) for q, messages in self.waiting.items()}

    def _debounced(self, task: str, queue: str) -> bool:
        now = time.monotonic()
        if self._pending_until.get(task, -1.0) > now:
            return True  # one waits: it takes this commit's work too
        self._pending_until[task] = now + PENDING_REQUEST_TTL_S
        return self._send(task, [], queue)

    def _send(self, task: str, args: list[Any], queue: str) -> bool:
        self.waiting[queue].append((task, args))
        return True
