"""A three-node Elasticsearch cluster on the loopback interface, from the same
distribution the stack runs: every tenant's index has two shards and a replica of each; one
node (the client's first) is killed during an ingest and the searches running beside it, then
started again. Nothing is lost, no search answers 5xx, and the stores agree again within 60 s
of the node's return.

Sized for CI (CONCORD_CLUSTER_TEST_DOCUMENTS, 200 by default, runs it larger)."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from services.cli.stack import ElasticsearchService, _port_in_use
from shared.settings import Settings, get_settings
from shared.stores.elastic import get_es
from shared.stores.es_index import ensure_index
from tests.conftest import CeleryProcess, wait_for
from tests.helpers import (
    document_count,
    jobs_in_flight,
    paused,
    tenant_index,
    upload_text,
    wait_converged,
)

NODES = 3
DOCUMENTS = int(os.environ.get("CONCORD_CLUSTER_TEST_DOCUMENTS", "200"))
CONVERGE_S = 60


def _free_ports(count: int, start: int) -> int:
    """The first of ``count`` consecutive free ports from ``start``."""
    port = start
    while any(_port_in_use(port + i) for i in range(count)):
        port += count
    return port


def _cluster_settings(base: Settings, state: Path) -> dict[str, Any]:
    return {
        "state_dir": state,
        # above the run's own node: two system runs at once (scripts/test.sh) never meet
        "es_port": _free_ports(NODES, base.es_port + 1),
        "es_transport_port": _free_ports(NODES, base.es_transport_port + 1),
        "es_nodes": NODES,
        "es_heap": "256m",
        "es_replicas": 1,
        "es_shards": 2,
        "es_index_prefix": f"concord-cluster-{uuid.uuid4().hex[:6]}",
    }


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[ElasticsearchService]]:
    """Three nodes under a state directory of their own; this process's client talks to
    them (the suite's single node is left alone)."""
    base = get_settings()
    state = base.state_path() / f"test-es-cluster-{uuid.uuid4().hex[:6]}"
    state.mkdir(parents=True)
    state.chmod(0o755)
    overrides = _cluster_settings(base, state)
    settings = base.model_copy(update=overrides)
    nodes = [ElasticsearchService(settings, node) for node in range(NODES)]
    # The suite's own installation of the distribution, rather than a second extraction.
    nodes[0].root.mkdir(parents=True)
    nodes[0].home.symlink_to(ElasticsearchService(base).home)
    try:
        for node in nodes:
            node.up()
        for key, value in overrides.items():
            if key != "state_dir":
                monkeypatch.setattr(base, key, value)
        get_es.cache_clear()
        ensure_index(base)
        yield nodes
    finally:
        get_es.cache_clear()
        for node in reversed(nodes):
            node.down()
        shutil.rmtree(state, ignore_errors=True)


def _cluster_env(settings: Settings) -> dict[str, str]:
    """The cluster worker's environment: the cluster's nodes, and the shipped relay interval
    and task time limits (the suite shortens them; this scenario's figures are the defaults')."""
    shipped = {
        f"CONCORD_{name.upper()}": str(Settings.model_fields[name].default)
        for name in ("relay_interval_seconds", "task_soft_time_limit_s", "task_time_limit_s")
    }
    return {
        **shipped,
        "CONCORD_ES_PORT": str(settings.es_port),
        "CONCORD_ES_TRANSPORT_PORT": str(settings.es_transport_port),
        "CONCORD_ES_NODES": str(settings.es_nodes),
        "CONCORD_ES_REPLICAS": str(settings.es_replicas),
        "CONCORD_ES_SHARDS": str(settings.es_shards),
        "CONCORD_ES_INDEX_PREFIX": settings.es_index_prefix,
    }


def _health(node: ElasticsearchService) -> dict[str, Any]:
    return dict(httpx.get(f"{node.url}/_cluster/health", timeout=5).json())


def test_losing_a_node_mid_ingest_loses_nothing_and_fails_no_search(
    client: TestClient,
    auth: dict[str, str],
    tenant: str,
    worker: CeleryProcess,
    cluster: list[ElasticsearchService],
    tmp_path: Path,
) -> None:
    settings = get_settings()
    cluster_worker = CeleryProcess("worker", tmp_path / "cluster-worker", _cluster_env(settings))
    cluster_worker.log.parent.mkdir()
    statuses: Counter[str] = Counter()
    stop = threading.Event()

    def searches() -> None:
        queries = ["river boats", "glacier valleys", "bees and flowers", "kettle water"]
        i = 0
        while not stop.is_set():
            body = {"query": queries[i % len(queries)], "mode": "hybrid", "top_k": 5}
            response = client.post("/v1/search", headers=auth, json=body)
            i += 1
            if response.status_code >= 500:
                statuses["5xx"] += 1
            elif response.status_code == 200 and response.json()["degraded"]:
                statuses["degraded"] += 1
            else:
                statuses[str(response.status_code)] += 1
            time.sleep(0.05)

    with paused(worker):  # the cluster's worker alone takes this ingest and its relay
        cluster_worker.start()
        searcher = threading.Thread(target=searches)
        searcher.start()
        try:
            victim = cluster[0]  # the first URL of every client
            for i in range(DOCUMENTS):
                upload_text(
                    client, auth, f"doc-{i}", f"Note {i} on river boats and glacier valleys."
                )
                if i == DOCUMENTS // 3:
                    pid = victim.pid()
                    assert pid is not None and pid > 1
                    os.kill(pid, signal.SIGKILL)
                    killed_at = time.monotonic()
            wait_for(lambda: jobs_in_flight(tenant) == 0, 180, what="the ingest to finish")
            down_s = time.monotonic() - killed_at
            victim.up()
            wait_for(lambda: _health(cluster[1])["status"] == "green", CONVERGE_S, what="green")
            returned_at = time.monotonic()
            chunks = wait_converged(tenant, timeout=CONVERGE_S)
            converged_s = time.monotonic() - returned_at
        finally:
            stop.set()
            searcher.join(30)
            cluster_worker.stop()
    index = get_es().indices.get_settings(index=tenant_index(tenant))
    [shape] = [v["settings"]["index"] for v in index.values()]
    assert (shape["number_of_shards"], shape["number_of_replicas"]) == ("2", "1")
    print(
        f"3 nodes, 2 shards, 1 replica, {DOCUMENTS} documents: one node down {down_s:.1f} s; "
        f"stores agreed {converged_s:.1f} s after the cluster was green again; "
        f"searches {dict(statuses)}"
    )
    assert statuses["5xx"] == 0 and statuses["200"] > 0
    assert document_count(tenant) == DOCUMENTS
    assert len(chunks) == DOCUMENTS  # one chunk each, in both stores, at the same versions
    assert converged_s <= CONVERGE_S
