"""JSON structured logs with the request id and job id of the work being done.

The API gives every request an id (the caller's ``X-Request-ID`` when it is sane, else a new
one) and returns it in the response header; an upload's job row records it, and the worker
logs that job's lines with the same ``request_id`` and the ``job_id``, so one grep follows a
document from the HTTP request to the index."""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

request_id_var: ContextVar[str | None] = ContextVar("request_id", default=None)
job_id_var: ContextVar[str | None] = ContextVar("job_id", default=None)
_SANE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


def new_request_id(offered: str | None = None) -> str:
    """The caller's id if it is short and plain (it ends up in logs), else a fresh one."""
    return offered if offered and _SANE_ID.match(offered) else uuid.uuid4().hex


def current_request_id() -> str | None:
    return request_id_var.get()


@contextmanager
def job_context(job_id: str, request_id: str | None) -> Iterator[None]:
    job_token = job_id_var.set(job_id)
    request_token = request_id_var.set(request_id)
    try:
        yield
    finally:
        job_id_var.reset(job_token)
        request_id_var.reset(request_token)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, var in (("request_id", request_id_var), ("job_id", job_id_var)):
            value = var.get()
            if value:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_json_logging(level: int = logging.INFO) -> None:
    """Route every logger (ours, uvicorn's, celery's) through one JSON handler."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "celery"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
