"""The one project-wide task decorator: acks late, time limits, an explicit retry policy.

A task declares which errors it retries (``retry_on``: with exponential backoff and jitter,
up to ``max_retries``) and what happens once it gives up (``give_up``: record the failure,
or fall back to a slower path); anything else fails at once. Never swallow an exception
inside a task.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from celery import Task
from celery.exceptions import Retry

from shared.retry import is_retriable, retry_delay
from shared.settings import get_settings
from workers.celery_app import celery_app

__all__ = ["concord_task", "retry_if_retriable"]

F = TypeVar("F", bound=Callable[..., Any])
# give_up(task, error, *the task's arguments, **its keyword arguments): returns the task's
# result, or raises its failure.
GiveUp = Callable[..., Any]


class ConcordTask(Task):  # type: ignore[misc]
    """Runs the task's function (its ``run``, with the function's own signature, which
    Celery checks a message's arguments against) under the task's retry policy."""

    retry_on: Callable[[BaseException], bool] | None = None
    give_up: GiveUp | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except Retry:
            raise
        except Exception as error:
            if self.retry_on is not None and self.retry_on(error):
                _retry_while_allowed(self, error)
            if self.give_up is None:
                raise
            return self.give_up(self, error, *args, **kwargs)


def concord_task(
    name: str,
    queue: str,
    *,
    max_retries: int = 5,
    retry_on: Callable[[BaseException], bool] | None = None,
    give_up: GiveUp | None = None,
    long_running: bool = False,
) -> Callable[[F], Task]:
    """``retry_on``: the errors retried (e.g. ``shared.retry.is_retriable``); none by default.
    ``give_up``: called with the task, the error and the task's arguments when the error is
    not retried (or the retries are spent); what it returns is the task's result, what it
    raises its failure. ``long_running``: acknowledged on start and without the global time
    limits, for work that outlives the broker's visibility timeout and tracks its own state
    in Postgres."""

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
            name=name,
            bind=True,
            queue=queue,
            max_retries=max_retries,
            base=ConcordTask,
            # Class attributes of the task: as static methods, never bound to it.
            retry_on=staticmethod(retry_on) if retry_on else None,
            give_up=staticmethod(give_up) if give_up else None,
            **options,
        )(fn)
        return task

    return decorate


def _retry_while_allowed(task: Task, error: Exception) -> None:
    retries = task.request.retries or 0
    if retries < (task.max_retries or 0):
        raise task.retry(exc=error, countdown=retry_delay(retries)) from error


def retry_if_retriable(task: Task, error: Exception) -> None:
    """For a ``give_up`` path that meets an error of its own: raise the task's retry if the
    error is one a retry may fix and retries are left; otherwise return."""
    if is_retriable(error):
        _retry_while_allowed(task, error)
