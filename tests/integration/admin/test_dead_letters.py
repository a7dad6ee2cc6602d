"""The operator's dead letters and admin routes: replayed jobs and repair letters, and the
admin scope."""

from __future__ import annotations

import subprocess
import sys

from shared.db import unit_of_work
from shared.models import DeadLetter
from shared.relay import service as relay
from shared.stores.compose import connect
from shared.stores.elastic import get_es
from tests.conftest import wait_for
from tests.helpers import (
    dead_lettered_upload,
    key_headers,
    suite_queue,
    tenant_index,
    upload_text,
    wait_converged,
    wait_job,
)


def test_dlq_replay_reruns_a_dead_lettered_job(client, auth, tenant, worker):
    job_id, letter_id = dead_lettered_upload(client, auth, worker)
    result = subprocess.run(
        [sys.executable, "-m", "services.cli.main", "dlq", "replay", str(letter_id)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    job = wait_job(client, auth, job_id)
    assert job["attempts"] == 1
    wait_converged(tenant)
    with unit_of_work() as uow:
        assert uow.session.get(DeadLetter, letter_id) is None


def test_admin_endpoints_need_the_admin_scope(client, auth, tenant):
    admin = key_headers(tenant, ["admin"])
    assert client.get("/v1/admin/stats", headers=auth).status_code == 403
    assert client.get("/v1/admin/stats").status_code == 401
    stats = client.get("/v1/admin/stats", headers=admin)
    assert stats.status_code == 200 and "outbox_backlog" in stats.json()
    report = client.post("/v1/admin/reconcile", headers=admin, json={})
    assert report.status_code == 200 and report.json()["total_drift"] == 0
    assert client.get("/v1/admin/jobs", headers=admin, params={"stuck": True}).status_code == 200
    assert client.get("/v1/admin/dead-letters/999999", headers=admin).status_code == 404
    # admin implies read and write on its own tenant
    assert client.post("/v1/search", headers=admin, json={"query": "x"}).status_code == 200


def test_replaying_a_repair_letter_overwrites_the_equal_version(client, auth, tenant, worker):
    """A repair (from reconcile) may overwrite a copy at its own version, as a copy edited
    outside Concord is; replayed from its dead letter it must still be a repair, not an
    index at that version, which Elasticsearch answers 409 and the relay counts as done."""
    from shared.admin.service import replay_dead_letter
    from tests.helpers import outbox_dead_letter

    up = upload_text(client, auth, "petrel", "Storm petrels patter on the waves.")
    wait_job(client, auth, up["job_id"])
    wait_converged(tenant)
    es, alias, chunk = get_es(), tenant_index(tenant), f"{up['document_id']}:0"
    copy = es.get(index=alias, id=chunk)
    es.index(  # edited outside Concord, at the same version
        index=alias,
        id=chunk,
        version=copy["_version"],
        version_type="external_gte",
        document={**copy["_source"], "text": "edited outside"},
        refresh=True,
    )
    letter_id = outbox_dead_letter(
        tenant,
        chunk,
        "es_503",
        "unavailable",
        5,
        {"op": "repair", "version": up["version"], "document_id": up["document_id"]},
    )
    with unit_of_work() as uow:
        replay_dead_letter(uow, letter_id, tenant, queue=suite_queue())

    def repaired() -> bool:
        relay.drain(connect(), unit_of_work)
        es.indices.refresh(index=alias)
        return es.get(index=alias, id=chunk)["_source"]["text"] != "edited outside"

    wait_for(repaired, 30, what="the replayed repair to overwrite the edited copy")
