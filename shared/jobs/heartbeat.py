"""The heartbeat that keeps a running job's lease alive while its process works on it.

A lease is short (``job_lease_seconds``, 20 s by default), so that the jobs of a process that
died (SIGKILL, OOM, a lost host) are taken over by the sweep seconds after their last renewal,
not after the longest a job could ever take. While the process is alive a thread of its own
renews the leases every ``job_heartbeat_seconds``, however long the job runs; a process that
hangs is ended by the task's hard time limit, and its heartbeat with it.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterable
from types import TracebackType

from shared.db import Transactions
from shared.jobs import repository as repo
from shared.settings import Settings

log = logging.getLogger(__name__)


class LeaseHeartbeat:
    """Renews the leases of ``job_ids`` (those still running) until the block ends, each beat
    in a transaction of its own from ``transactions``."""

    def __init__(
        self, job_ids: Iterable[uuid.UUID], transactions: Transactions, settings: Settings
    ) -> None:
        self._job_ids = list(job_ids)
        self._transactions = transactions
        self._interval = settings.job_heartbeat_seconds
        self._lease_seconds = settings.job_lease_seconds
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease-heartbeat", daemon=True)

    def __enter__(self) -> LeaseHeartbeat:
        if self._job_ids:
            self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Not joined: a beat stuck on a silent connection must not hold up the task that is
        # done. The thread sees the event at its next wake and ends; it renews only jobs that
        # are still running, so a late beat changes nothing for a finished one.
        self._stopped.set()

    def _run(self) -> None:
        while not self._stopped.wait(self._interval):
            try:
                with self._transactions() as uow:
                    repo.renew_leases(uow.session, self._job_ids, self._lease_seconds)
            except Exception as e:  # Postgres away: the next beat tries again
                log.warning("lease heartbeat for %d jobs failed: %s", len(self._job_ids), e)
