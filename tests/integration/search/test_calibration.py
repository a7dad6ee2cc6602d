"""A tenant's decision threshold set from its own corpus (shared/search/calibration.py): stored,
used by its searches and said so in the decision, overridden by a request's own threshold,
and not set for a corpus too small to draw questions from."""

from __future__ import annotations

from fastapi.testclient import TestClient

from shared.db import unit_of_work
from shared.search import calibration
from shared.search import repository as search_repo
from shared.settings import get_settings
from shared.stores.compose import connect
from tests.factories import indexed_notes

PARTS = ["spool", "journal", "cache", "socket", "lockfile", "keyring", "queue", "snapshot"]
ACTIONS = ["rotates", "compacts", "verifies", "encrypts", "mirrors"]


def _notes() -> list[str]:
    """Forty one-chunk notes of a made-up tool's manual, each sentence its own."""
    return [
        f"The frobctl daemon {action} the {part} files every {n + 2} minutes unless "
        f"--{part}-interval overrides it for the {part} directory."
        for n, (part, action) in enumerate((p, a) for p in PARTS for a in ACTIONS)
    ]


def test_a_tenants_searches_use_the_threshold_set_from_its_corpus(
    client: TestClient, auth: dict[str, str], tenant: str
) -> None:
    indexed_notes(tenant, _notes())  # no worker needed
    settings = get_settings()
    result = calibration.calibrate(connect(), unit_of_work, tenant, settings)
    assert result is not None and result.samples >= calibration.MIN_SAMPLES
    assert result.chunks == 40
    # far questions (cooking, sport, geography) score well below the manual's own
    assert result.min_score is not None
    assert result.background_high < result.min_score < result.corpus_low
    with unit_of_work() as uow:
        stored = search_repo.calibration(uow.session, tenant)
        assert stored is not None and stored.min_score == result.min_score
    # nothing has changed since: beat's run leaves it alone
    assert tenant not in {
        c.tenant_id for c in calibration.calibrate_due(connect(), unit_of_work, settings)
    }

    body = {"query": "how often does frobctl rotate the spool files", "top_k": 3}
    decision = client.post("/v1/search", headers=auth, json=body).json()["decision"]
    assert (decision["threshold"], decision["threshold_source"]) == (result.min_score, "calibrated")
    assert decision["status"] == "answerable"
    own = {**body, "policy": {"min_score": 0.1}}
    decision = client.post("/v1/search", headers=auth, json=own).json()["decision"]
    assert (decision["threshold"], decision["threshold_source"]) == (0.1, "request")


def test_a_corpus_too_small_to_draw_from_keeps_the_default(
    client: TestClient, auth: dict[str, str], tenant: str
) -> None:
    indexed_notes(tenant, _notes()[:1])
    assert calibration.calibrate(connect(), unit_of_work, tenant, get_settings()) is None
    with unit_of_work() as uow:
        assert search_repo.calibration(uow.session, tenant) is None
    decision = client.post("/v1/search", headers=auth, json={"query": "frobctl spool"}).json()[
        "decision"
    ]
    assert decision["threshold_source"] == "default"
    assert decision["threshold"] == get_settings().policy_min_score


def test_every_page_of_a_cursor_is_decided_with_the_first_pages_threshold(
    client: TestClient, auth: dict[str, str], tenant: str
) -> None:
    """A cursor's later pages use the query the first page resolved: the tenant's calibrated
    threshold, not the deployment's default (page 2 was decided with the default 0.3 while page
    1 used the calibrated one, so one result could be answerable on one page and not on the
    other)."""
    indexed_notes(tenant, _notes())
    result = calibration.calibrate(connect(), unit_of_work, tenant, get_settings())
    assert result is not None and result.min_score is not None
    assert result.min_score != get_settings().policy_min_score
    body = {"query": "which files does frobctl rotate", "top_k": 2, "paginate": True}
    page = client.post("/v1/search", headers=auth, json=body).json()
    decisions = [page["decision"]]
    while page["next_cursor"] and len(decisions) < 3:
        page = client.post(
            "/v1/search/next", headers=auth, json={"cursor": page["next_cursor"]}
        ).json()
        decisions.append(page["decision"])
    assert len(decisions) == 3
    assert {(d["threshold"], d["threshold_source"]) for d in decisions} == {
        (result.min_score, "calibrated")
    }


def test_a_tenant_is_calibrated_once_its_ingest_settles_without_a_command(
    client: TestClient, auth: dict[str, str], tenant: str, worker: object
) -> None:
    """Before, eight minutes after a tenant's first ingest its threshold was still the
    default (beat calibrates every ten minutes). The batch that writes a tenant's last job
    asks for its calibration; the worker calibrates it once nothing of it is queued."""
    from tests.conftest import wait_for
    from tests.helpers import upload_text, wait_job

    jobs = [
        upload_text(client, auth, f"note-{i}", text)["job_id"] for i, text in enumerate(_notes())
    ]
    for job in jobs:
        wait_job(client, auth, job)

    def calibrated() -> float | None:
        with unit_of_work() as uow:
            row = search_repo.calibration(uow.session, tenant)
            return None if row is None else row.min_score

    threshold = wait_for(calibrated, 60, what="the tenant's calibration after its ingest")
    assert threshold != get_settings().policy_min_score
    with unit_of_work() as uow:
        row = search_repo.calibration(uow.session, tenant)
        assert row is not None and row.chunks == 40
