"""Start-up warm-up: what the first requests would otherwise pay for (the models, the parsers
that screen uploads, the connections to the stores), done in a thread once the API starts.

``/readyz`` answers 503 with the step under way until it is done, so a load balancer sends
no traffic before; a request that comes anyway waits for the model loading it needs (the
loaders are locked), never loads a second copy. A step that fails is logged and shown by
``/readyz``, but does not hold readiness back for ever: the stores' own checks say whether
the API can serve (a store down at start-up comes back), and a model that cannot load fails
the requests that need it with its reason."""

from __future__ import annotations

import atexit
import gc
import io
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shared.stores.compose import Stores

log = logging.getLogger(__name__)

Step = tuple[str, Callable[[], None]]


def _models() -> None:
    from shared.ingest.embedding import get_embedder
    from shared.rerankers.scoring import warm_up
    from shared.search.coverage import QueryTerms, common_word
    from shared.search.retrieve import ALL_CORES

    get_embedder().embed_query("warm up")  # the query encoder of a search with a lexical arm
    get_embedder().embed_query("warm up", threads=ALL_CORES)  # and of a dense-only one
    warm_up()  # the cross-encoder
    common_word("warm")  # the word list the default decision reads (a second to load)
    QueryTerms.of("how do I warm up the stemmer?")  # the lexical analysis of a question


def _parsers() -> None:
    """Screen one small upload of each kind, as ``POST /v1/documents`` does (pypdf opens a
    PDF there: its first import cost the first PDF upload seconds)."""
    from pypdf import PdfWriter

    from shared.documents.intake import check_upload
    from shared.documents.schemas import Upload
    from shared.settings import get_settings

    pdf = io.BytesIO()
    writer = PdfWriter()
    writer.add_blank_page(width=72, height=72)
    writer.write(pdf)
    samples = {
        "application/pdf": pdf.getvalue(),
        "text/html": b"<h1>Warm</h1><p>up</p>",
        "text/markdown": b"# Warm\n\nup",
        "application/json": b'{"text": "warm up"}',
        "text/plain": b"warm up",
    }
    for content_type, raw in samples.items():
        check_upload(
            Upload(tenant_id="warm-up", external_id="warm-up", raw=raw, content_type=content_type),
            get_settings(),
        )


class _Rehearsal(Exception):
    pass


def _connections(stores: Stores | None) -> None:
    """Open a connection to each store (the readiness checks' own round trips) and to the
    broker, and rehearse an upload's statements in a transaction rolled back (SQLAlchemy
    compiles each statement the first time it runs: a first upload paid 25 ms for it)."""
    from services.api.readiness import readiness_checks
    from shared.db import unit_of_work
    from shared.documents.schemas import Upload
    from shared.documents.service import accept_uploads
    from shared.settings import get_settings
    from shared.stores.compose import connect

    settings = get_settings()
    stores = stores or connect(settings)
    readiness_checks(settings, stores.index)
    stores.queue.warm_up()
    upload = Upload(
        tenant_id="warm-up", external_id="warm-up", raw=b"warm up", content_type="text/plain"
    )
    try:
        with unit_of_work() as uow:
            accept_uploads(uow, settings, [upload])
            raise _Rehearsal  # rolled back: nothing is written, nothing published
    except _Rehearsal:
        pass


@dataclass
class WarmUp:
    steps: list[Step] | None = None  # None: the models, the parsers, the connections
    stores: Stores | None = None  # whose connections it opens: the app's (create_app sets it)
    seconds: dict[str, float] = field(default_factory=dict)  # each step done, in order
    errors: dict[str, str] = field(default_factory=dict)
    current: str | None = None
    _started: float = 0.0
    _done: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        self._started = time.monotonic()
        threading.Thread(target=self._run, name="warm-up", daemon=True).start()

    def _run(self) -> None:
        steps = self.steps
        if steps is None:
            steps = [
                ("models", _models),
                ("parsers", _parsers),
                ("connections", lambda: _connections(self.stores)),
            ]
        for name, step in steps:
            self.current = name
            began = time.monotonic()
            try:
                step()
            except Exception as e:  # reported by /readyz; the requests that need it fail
                log.exception("warm-up step %s failed", name)
                self.errors[name] = f"{type(e).__name__}: {str(e)[:200]}"
            self.seconds[name] = round(time.monotonic() - began, 3)
        self.current = None
        # What start-up made (the models are millions of objects) lives as long as the
        # process: moved out of the collector's sight, so that no request pays for a full
        # collection walking it (bench/first_request.py: a first upload took 345-413 ms in 3
        # of 9 runs before, 57-79 ms in 6 of 6 after).
        gc.collect()
        gc.freeze()
        # Given back at exit: frozen objects are never freed, and native libraries (triton's
        # nanobind) then report hundreds of leaks as the process ends.
        atexit.register(gc.unfreeze)
        log.info("warm-up done in %.1f s: %s", time.monotonic() - self._started, self.seconds)
        self._done.set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def check(self) -> dict[str, Any]:
        """For /readyz: ok once every step has run; the steps' times, and what failed."""
        # Snapshots: the warm-up thread adds to both while /readyz reads them.
        done = ", ".join(f"{name} {s:.2f} s" for name, s in list(self.seconds.items()))
        failed = "; ".join(f"{name} failed: {why}" for name, why in list(self.errors.items()))
        if not self._done.is_set():
            so_far = time.monotonic() - self._started
            detail = f"warming up: {self.current} ({so_far:.1f} s so far)" + (
                f"; done: {done}" if done else ""
            )
            return {"ok": False, "detail": detail}
        return {"ok": True, "detail": f"done: {done}" + (f"; {failed}" if failed else "")}
