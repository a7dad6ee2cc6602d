"""The outbox relay's requests: debounced (one waits at a time) and never left for beat."""

from __future__ import annotations

import time
import uuid
from typing import Any


def test_relay_requests_wait_one_at_a_time_and_the_last_commit_of_a_burst_is_not_left_for_beat(
    monkeypatch: Any,
) -> None:
    """A commit asks for a drain unless one is asked for and has not started (that one
    claims the commit's rows too); once a drain starts, the next commit asks again at once.
    The last of several quick commits is therefore never left for beat, as it was while a
    request a second was sent at most (bench/freshness.py: p95 from indexed to searchable
    1.70 s before, 1.03 s after). Each run gets a key of its own: the suite's worker clears
    the real one whenever its drains start."""
    from shared import queue

    key, task = f"test:relay-pending-{uuid.uuid4().hex[:8]}", "concord.test.drain"
    sent: list[str] = []

    def send(name: str, args: list[Any], queue_name: str) -> bool:
        sent.append(name)
        return True

    monkeypatch.setattr(queue, "_send", send)
    assert queue._publish_debounced(key, task, queue.RELAY_QUEUE) and queue._publish_debounced(
        key, task, queue.RELAY_QUEUE
    )
    assert sent == [task]  # the second commit's rows are the waiting drain's
    time.sleep(1.2)  # longer than the old once-a-second window: still waiting, still one
    assert queue._publish_debounced(key, task, queue.RELAY_QUEUE)
    assert sent == [task]
    queue._request_taken(key)  # the drain starts
    assert queue._publish_debounced(key, task, queue.RELAY_QUEUE)
    assert sent == [task, task]  # a commit after its start asks for the next one at once
    assert 0 < queue._redis().ttl(key) <= queue.PENDING_REQUEST_TTL_S  # a lost one expires

    monkeypatch.setattr(queue, "_send", lambda *_: False)
    queue._request_taken(key)
    assert not queue._publish_debounced(key, task, queue.RELAY_QUEUE)
    assert not queue._redis().exists(key)  # nothing waits: the next commit asks again
