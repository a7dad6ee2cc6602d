"""The operator console in headless Chromium (Debian's, driven by Playwright), against the API
served over real HTTP; plus /readyz, /metrics and request ids carried into the worker's logs.

Screenshots of each page go to ``$CONCORD_TEST_ARTIFACTS/console`` (default
``test-artifacts/console``)."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from shared.stores.elastic import get_es
from tests.conftest import CeleryProcess, wait_for
from tests.helpers import (
    dead_lettered_upload,
    new_key,
    suite_queue,
    tenant_index,
    wait_converged,
    wait_job,
)

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(os.environ.get("CONCORD_TEST_ARTIFACTS", "test-artifacts")) / "console"
# Without these, Chromium tries Google's hosts at start-up; this machine's network refuses them.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
def admin_key(tenant: str) -> str:
    return new_key(tenant, ["admin"])


@pytest.fixture
def page(live_api: str) -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.fail("Debian chromium is not installed (scripts/setup.sh installs it)")
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        tab = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        tab.on("pageerror", lambda e: errors.append(str(e)))
        tab.console_errors = errors  # type: ignore[attr-defined]
        yield tab
        browser.close()


def shot(page: Any, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def test_console_upload_search_trace_reconcile_and_replay(
    page: Any,
    live_api: str,
    admin_key: str,
    tenant: str,
    client: TestClient,
    worker: CeleryProcess,
    tmp_path: Path,
) -> None:
    auth = {"Authorization": f"Bearer {admin_key}"}
    page.goto(f"{live_api}/console/#ingestion")
    # Before, the page was blank until a key was entered, a placeholder the only hint.
    page.evaluate("sessionStorage.clear()")
    page.reload()
    welcome = page.inner_text("#welcome")
    assert "concord keys create --tenant" in welcome and "admin" in welcome
    shot(page, "welcome")
    page.fill("#api-key", admin_key)
    page.click("#key-form button")
    page.wait_for_selector("#key-state:has-text('key set')")
    # A webhook endpoint whose receiver never answers: its delivery log shows the attempts.
    hook = client.post(
        "/v1/admin/webhooks",
        json={"url": "http://127.0.0.1:9/never-up", "events": ["job.indexed"]},
        headers=auth,
    )
    assert hook.status_code == 201, hook.text

    # Upload a document from the page and watch its job reach `indexed`.
    doc = tmp_path / "quokka.md"
    doc.write_text(
        "# Rottnest Island\n\nThe quokka is a small marsupial that lives on Rottnest Island. "
        "Quokkas are nocturnal and eat grasses and shrubs."
    )
    page.set_input_files("#upload-file", str(doc))
    page.fill("#upload-title", "Island marsupials")
    page.click("#upload-form button")
    page.wait_for_selector("#job-state:has-text('indexed')", timeout=90_000)
    wait_converged(tenant)
    page.click("#refresh-jobs")
    page.wait_for_selector("#jobs td:has-text('indexed')")
    # Jobs are named by their document's external id and title, not id fragments.
    jobs_text = page.inner_text("#jobs")
    assert "quokka.md" in jobs_text and "Island marsupials" in jobs_text, jobs_text
    shot(page, "ingestion")

    # Search for it; the matched words are highlighted; open its trace.
    page.goto(f"{live_api}/console/#search")
    page.fill("#q", "quokka marsupial island")
    page.click("#search-form button")
    page.wait_for_selector("#results li")
    first = page.locator("#results li").first
    # Named by title and section (a PDF's results by their page, "§ page 3", the same way).
    assert first.locator(".result-name").inner_text() == "Island marsupials § Rottnest Island"
    assert first.locator("mark").count() >= 2
    assert "answerable" in page.inner_text("#decision")
    # the count sits under the form with its results, not above the page's title
    count = page.locator("#result-count")
    assert "result(s)" in count.inner_text()
    assert count.bounding_box()["y"] > page.locator("#page-search h1").bounding_box()["y"]
    first.locator(".show-trace").click()
    trace = first.locator(".trace")
    assert trace.is_visible()
    assert "fused" in trace.inner_text() and "policy: included" in trace.inner_text()
    page.click("#decision details summary")  # the timings, a table of stages
    assert page.locator("#timings tr").count() >= 3 and "retrieve" in page.inner_text("#timings")
    shot(page, "search")
    # At a phone's width nothing runs off the screen: the query box and results fit.
    page.set_viewport_size({"width": 420, "height": 900})
    box = page.locator("#q").bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 420, box
    assert page.evaluate("document.documentElement.scrollWidth") <= 420
    shot(page, "search-phone")
    page.set_viewport_size({"width": 1400, "height": 1000})

    # Inject drift (the Elasticsearch copy is lost) and find it with a dry run from the page.
    alias = tenant_index(tenant)
    hit = get_es().search(index=alias, query={"term": {"tenant_id": tenant}}, size=1)
    get_es().delete(index=alias, id=hit["hits"]["hits"][0]["_id"], refresh=True)
    page.goto(f"{live_api}/console/#consistency")
    page.click("#reconcile-form button")
    page.wait_for_selector("#reconcile-report #total-drift", timeout=60_000)
    assert page.inner_text("#reconcile-report #total-drift") == "1"
    assert "missing 1" in page.inner_text("#reconcile-report")
    page.wait_for_selector("#drift-chart svg circle")
    assert page.locator("#drift-chart circle title", has_text="missing: 1").count() >= 1
    shot(page, "consistency")

    # A dead letter, replayed with the page's button, runs again to `indexed`.
    job_id, letter_id = dead_lettered_upload(client, auth, worker)
    page.goto(f"{live_api}/console/#ingestion")
    page.wait_for_selector(f"button.replay[data-id='{letter_id}']")
    shot(page, "dead-letters")
    page.click(f"button.replay[data-id='{letter_id}']")
    page.wait_for_selector(f"#message:has-text('dead letter {letter_id} replayed')")
    assert wait_job(client, auth, job_id)["state"] == "indexed"

    page.goto(f"{live_api}/console/#webhooks")
    page.wait_for_selector("#webhooks td:has-text('never-up')")
    page.click(f"button.show-deliveries[data-id='{hook.json()['id']}']")
    page.wait_for_selector("#deliveries td:has-text('job.indexed')")
    assert "pending" in page.inner_text("#deliveries") or "failed" in page.inner_text("#deliveries")
    shot(page, "webhooks")

    page.goto(f"{live_api}/console/#stats")
    page.wait_for_selector("#stats td:has-text('chunks postgres')")
    stats = page.inner_text("#stats")
    # Before, jobs and queue depths were raw JSON strings; now tables of their own
    assert "queue depth" in stats and "{" not in stats
    assert page.locator("#stats table.nested").count() >= 2
    assert page.is_hidden("#welcome")
    shot(page, "stats")

    assert page.console_errors == []
    for name in (
        "welcome",
        "ingestion",
        "search",
        "search-phone",
        "consistency",
        "dead-letters",
        "webhooks",
        "stats",
    ):
        assert (ARTIFACTS / f"{name}.png").stat().st_size > 10_000, name


def test_the_api_docs_load_with_the_network_blocked(page: Any, live_api: str) -> None:
    """/docs (Swagger UI) and /redoc list the operations with every request outside the API
    refused, as on a machine without internet."""
    refused: list[tuple[str, str]] = []

    def only_the_api(route: Any) -> None:
        if route.request.url.startswith(live_api):
            route.continue_()
        else:
            refused.append((route.request.resource_type, route.request.url))
            route.abort()

    page.route("**/*", only_the_api)
    page.goto(f"{live_api}/docs")
    page.wait_for_selector(".opblock-summary-path", timeout=30_000)
    paths = page.locator(".opblock-summary-path").all_inner_texts()
    assert "/v1/search" in paths and "/v1/documents/{document_id}" in paths
    shot(page, "docs")
    page.goto(f"{live_api}/redoc")
    page.wait_for_selector('[data-section-id*="operation/"]', timeout=30_000)
    assert page.locator('[data-section-id*="operation/"]').count() >= 10
    shot(page, "redoc")
    # Nothing the pages need is outside the API: ReDoc's bundle links its footer logo from its
    # CDN, an image whose absence shows as a console error and nothing else.
    assert all(kind == "image" and "redoc.ly" in url for kind, url in refused), refused
    errors = [e for e in page.console_errors if not (refused and "Failed to load resource" in e)]
    assert errors == [], page.console_errors


def test_console_without_a_key_shows_the_api_error(page: Any, live_api: str) -> None:
    page.goto(f"{live_api}/console/#search")
    page.fill("#q", "anything")
    page.click("#search-form button")
    page.wait_for_selector("#message.error")
    assert "401" in page.inner_text("#message")


def test_request_id_reaches_the_job_and_the_worker_log(
    client: TestClient, auth: dict[str, str], worker: CeleryProcess
) -> None:
    request_id = f"req-{uuid.uuid4().hex[:12]}"
    response = client.post(
        "/v1/documents",
        headers={**auth, "X-Request-ID": request_id},
        json={"external_id": "traced.txt", "text": "A traced upload about tardigrades."},
    )
    assert response.headers["X-Request-ID"] == request_id
    job = wait_job(client, auth, response.json()["job_id"])
    assert job["detail"]["request_id"] == request_id

    def logged() -> dict[str, Any] | None:
        for line in worker.log.read_text(errors="replace").splitlines():
            if request_id in line and line.startswith("{"):
                entry: dict[str, Any] = json.loads(line)
                return entry
        return None

    entry = wait_for(logged, 30, what="the worker's JSON log line")
    assert entry["request_id"] == request_id and entry["job_id"] == job["id"]
    # A caller's id that is not a plain token is replaced, never copied into the logs.
    odd = client.get("/healthz", headers={"X-Request-ID": "bad id\nwith newline"})
    assert odd.headers["X-Request-ID"] != "bad id\nwith newline"


def test_metrics_cover_routes_stages_and_system_figures(
    client: TestClient, auth: dict[str, str]
) -> None:
    client.post("/v1/search", headers=auth, json={"query": "metrics probe"})
    text = client.get("/metrics").text
    assert (
        'concord_api_request_seconds_count{method="POST",route="/v1/search",status="2xx"}' in text
    )
    for stage in ("embed", "hydrate", "policy"):
        assert f'concord_search_stage_seconds_count{{stage="{stage}"}}' in text, stage
    for family in (
        "concord_queue_depth",
        "concord_outbox_backlog",
        "concord_dead_letters",
        "concord_ingest_stage_seconds",
        "concord_degraded_queries_total",
    ):
        assert family in text, family


def test_system_figures_are_read_at_most_every_few_seconds_however_often_scraped() -> None:
    """/metrics needs no key, and its figures aggregate every job ever run: a burst of
    scrapes costs one read of Postgres per process, not one each."""
    from shared.db import unit_of_work
    from shared.metrics import SystemCollector

    reads = []

    def counted_unit_of_work() -> Any:
        reads.append(1)
        return unit_of_work()

    collector = SystemCollector(counted_unit_of_work, suite_queue())
    scrapes = [{m.name for m in collector.collect()} for _ in range(20)]
    assert len(reads) == 1
    assert all(names == scrapes[0] for names in scrapes)
    assert {"concord_outbox_backlog", "concord_ingest_stage_seconds"} <= scrapes[0]
