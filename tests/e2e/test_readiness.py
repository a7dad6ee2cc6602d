"""The first requests after start-up paid for loading the models and parsers (the
first PDF upload took 2.85 s). The API now warms up in a thread once it starts, and /readyz
answers 503 with the step under way until it is done."""

from __future__ import annotations

import threading

from fastapi.testclient import TestClient

from services.api.app import create_app
from services.api.warm_up import WarmUp
from tests.conftest import wait_for


def test_readyz_says_warming_up_until_the_warm_up_is_done() -> None:
    release = threading.Event()

    def held_models() -> None:
        release.wait(60)

    def no_parser() -> None:
        raise RuntimeError("no parser here")

    warming = WarmUp(steps=[("models", held_models), ("parsers", no_parser)])
    with TestClient(create_app(warming)) as client:
        waiting = client.get("/readyz")
        assert waiting.status_code == 503, waiting.text
        check = waiting.json()["checks"]["warm_up"]
        assert check["ok"] is False and check["detail"].startswith("warming up: models")
        assert client.get("/healthz").status_code == 200  # the process answers meanwhile

        release.set()
        ready = wait_for(
            lambda: ((r := client.get("/readyz")).status_code == 200 and r) or None,
            30,
            what="ready after the warm-up",
        )
        detail = ready.json()["checks"]["warm_up"]["detail"]
        # A failed step is shown, and does not hold readiness back for ever.
        assert detail.startswith("done: models") and "parsers failed: RuntimeError" in detail


def test_the_shipped_warm_up_loads_models_parsers_and_connections_without_error() -> None:
    warming = WarmUp()
    warming.start()
    assert warming.wait(300)
    assert warming.errors == {}
    assert list(warming.seconds) == ["models", "parsers", "connections"]
    assert warming.check()["ok"] is True
