"""The one project-wide task decorator: acks late, time limits, an explicit retry policy.

Only errors listed as retriable are retried (with exponential backoff and jitter); anything
else fails at once. Never swallow an exception inside a task.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from celery import Task

from shared.retry import is_retriable, retry_delay
from shared.settings import get_settings
from workers.celery_app import celery_app

__all__ = ["concord_task", "retry_if_retriable"]

F = TypeVar("F", bound=Callable[..., Any])


def concord_task(
    name: str, queue: str, max_retries: int = 5, long_running: bool = False
) -> Callable[[F], Task]:
    """``long_running``: acknowledged on start and without the global time limits, for work
    that outlives the broker's visibility timeout and tracks its own state in Postgres."""

    settings = get_settings()

    def decorate(fn: F) -> Task:
        options: dict[str, Any] = (
            {
                "acks_late": False,
                "soft_time_limit": settings.training_time_limit_s - 60,
                "time_limit": settings.training_time_limit_s,
            }
            if long_running
            else {"acks_late": True, "reject_on_worker_lost": True}
        )
        task: Task = celery_app.task(
            name=name, bind=True, queue=queue, max_retries=max_retries, **options
        )(fn)
        return task

    return decorate


def retry_if_retriable(task: Task, error: Exception) -> None:
    """Raise the task's retry (with backoff) if ``error`` is one a retry may fix and retries
    are left; otherwise return, and the caller records the failure."""
    retries = task.request.retries or 0
    if is_retriable(error) and retries < (task.max_retries or 0):
        raise task.retry(exc=error, countdown=retry_delay(retries)) from error
