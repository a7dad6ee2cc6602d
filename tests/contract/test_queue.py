"""The task queue's contract (shared/queue.TaskQueue), run against Celery's Redis transport and
the in-memory queue: what is published waits on its queue as one message per publish, in the
task's name with its arguments, and a request for a run (a relay drain, webhook deliveries, a
calibration) waits one at a time until that run starts. The Redis adapter also keeps what only
a shared Redis can show: a lost request lapses, a failed send leaves none waiting, a silent
Redis surfaces as StoreUnavailable where publishing must not fail quietly."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import pytest
import redis

from shared import queue as queues
from shared.errors import StoreUnavailable
from shared.queue import (
    ACCEPT_EVENTS_TASK,
    CALIBRATE_SETTLED_TASK,
    INGEST_QUEUE,
    PROCESS_JOB_TASK,
    PROCESS_JOBS_TASK,
    RELAY_QUEUE,
    RELAY_TASK,
    TRAIN_RERANKER_TASK,
    TRAINING_QUEUE,
    WEBHOOKS_QUEUE,
    WEBHOOKS_TASK,
    CeleryQueue,
    TaskQueue,
)
from shared.settings import get_settings
from shared.stores.memory import MemoryQueue
from tests.contract.port_calls import ALL, Claims

Sent = list[tuple[str, list[Any]]]


def _redis_queue() -> tuple[CeleryQueue, Callable[[str], Sent]]:
    """A CeleryQueue on a Redis database of its own (no worker of the suite consumes it),
    emptied first, and a reader of the messages waiting on each queue."""
    settings = get_settings()
    # The suite uses database 1, or 2 + its xdist worker's number (tests/conftest.py;
    # scripts/test.sh runs 2 workers by default): 8 above it is free within Redis' 16.
    own_db = settings.redis_db + 8
    assert own_db < 16, "the queue contract needs a Redis database of its own (fewer workers)"
    settings = settings.model_copy(update={"redis_db": own_db})
    client = redis.Redis(host=settings.redis_host, port=settings.redis_port, db=settings.redis_db)
    client.flushdb()

    def sent(queue: str) -> Sent:
        messages = [json.loads(raw) for raw in reversed(client.lrange(queue, 0, -1))]
        return [
            (m["headers"]["task"], json.loads(base64.b64decode(m["body"]))[0]) for m in messages
        ]

    return CeleryQueue(settings), sent


def _memory_queue() -> tuple[MemoryQueue, Callable[[str], Sent]]:
    memory = MemoryQueue()
    return memory, lambda queue: list(memory.waiting[queue])


@pytest.fixture(params=["redis", "memory"])
def queue(request: pytest.FixtureRequest) -> Iterator[tuple[TaskQueue, Callable[[str], Sent]]]:
    yield _redis_queue() if request.param == "redis" else _memory_queue()


RUNS = [
    ("publish_relay", "relay_started", RELAY_TASK, RELAY_QUEUE),
    ("publish_webhooks", "webhooks_started", WEBHOOKS_TASK, WEBHOOKS_QUEUE),
    ("publish_calibration", "calibration_started", CALIBRATE_SETTLED_TASK, TRAINING_QUEUE),
]


class TestTaskQueue:
    PORTS: ClassVar[Claims] = {TaskQueue: ALL}

    def test_each_publish_is_one_message_on_its_queue(
        self, queue: tuple[TaskQueue, Callable[[str], Sent]]
    ) -> None:
        tasks, sent = queue
        tasks.warm_up()
        a, b, c, trained = uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
        events = [{"type": "upload", "tenant_id": "t", "external_id": "x"}]
        assert tasks.publish_ingest_job(a) and tasks.publish_ingest_jobs([b, c])
        tasks.publish_upload_events(events)
        tasks.publish_training_job(trained)
        assert sent(INGEST_QUEUE) == [
            (PROCESS_JOB_TASK, [str(a)]),
            (PROCESS_JOBS_TASK, [[str(b), str(c)]]),
            (ACCEPT_EVENTS_TASK, [events]),
        ]
        assert sent(TRAINING_QUEUE) == [(TRAIN_RERANKER_TASK, [str(trained)])]
        depths = tasks.queue_depths()
        assert depths[INGEST_QUEUE] == 3 and depths[TRAINING_QUEUE] == 1
        assert depths[RELAY_QUEUE] == depths[WEBHOOKS_QUEUE] == 0

    @pytest.mark.parametrize(("publish", "started", "task", "name"), RUNS)
    def test_a_request_for_a_run_waits_one_at_a_time_until_the_run_starts(
        self,
        queue: tuple[TaskQueue, Callable[[str], Sent]],
        publish: str,
        started: str,
        task: str,
        name: str,
    ) -> None:
        """A commit asks for a run unless one is asked for and has not started (that one
        takes the commit's work too); once the run starts, the next commit asks again at
        once, so the last commit of a burst is never left for beat."""
        tasks, sent = queue
        assert getattr(tasks, publish)() and getattr(tasks, publish)()
        assert sent(name) == [(task, [])]  # the second commit's work is the waiting run's
        getattr(tasks, started)()
        assert getattr(tasks, publish)()
        assert sent(name) == [(task, []), (task, [])]


def test_a_lost_request_lapses_and_a_failed_send_leaves_none_waiting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tasks, sent = _redis_queue()
    assert tasks.publish_relay()
    pending = tasks._redis().ttl(queues.RELAY_PENDING_KEY)
    assert 0 < pending <= queues.PENDING_REQUEST_TTL_S  # its run never starting: it lapses
    tasks.relay_started()
    monkeypatch.setattr(queues, "_send", lambda *_: False)
    assert not tasks.publish_relay()
    assert not tasks._redis().exists(queues.RELAY_PENDING_KEY)  # the next commit asks again
    assert sent(RELAY_QUEUE) == [(RELAY_TASK, [])]


def test_a_silent_redis_fails_quietly_where_something_recovers_and_loudly_elsewhere() -> None:
    settings = get_settings().model_copy(update={"redis_port": 9, "redis_socket_timeout_s": 0.5})
    tasks = CeleryQueue(settings)
    assert not tasks.publish_ingest_job(uuid.uuid4())  # the job row is committed: the sweep
    assert not tasks.publish_relay()  # beat drains the outbox anyway
    for must_surface in (
        lambda: tasks.publish_training_job(uuid.uuid4()),
        lambda: tasks.publish_upload_events([{"type": "upload"}]),
        tasks.queue_depths,
    ):
        with pytest.raises(StoreUnavailable) as raised:
            must_surface()
        assert raised.value.store == "Redis"
