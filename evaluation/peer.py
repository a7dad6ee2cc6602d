"""The Haystack peer (bench/peers/haystack), run in its own virtual environment in the same
invocation as Concord's evaluation, against the same Postgres server (its own database),
the same Elasticsearch (its own index) and the same embedding model."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import psycopg

from evaluation.runner import RunResult
from shared.db.repository import ensure_database
from shared.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
PEER_DIR = ROOT / "bench" / "peers" / "haystack"
PEER_PYTHON = PEER_DIR / ".venv" / "bin" / "python"


class PeerUnavailable(RuntimeError):
    pass


def _ensure_database(settings: Settings, name: str) -> str:
    """The peer writes to a database of its own, so it never touches Concord's tables."""
    with psycopg.connect(
        host=settings.pg_host,
        port=settings.pg_port,
        user=settings.pg_user,
        password=settings.pg_password,
        dbname=settings.pg_database,
        autocommit=True,
    ) as conn:
        ensure_database(conn, name)
    return (
        f"postgresql://{settings.pg_user}:{settings.pg_password}"
        f"@{settings.pg_host}:{settings.pg_port}/{name}"
    )


def run_haystack(
    settings: Settings, dataset_dir: Path, stem: str, queries: list[tuple[str, str]]
) -> tuple[dict[str, RunResult], dict[str, Any]]:
    if not PEER_PYTHON.exists():
        raise PeerUnavailable(
            f"no peer environment at {PEER_PYTHON}: run bench/peers/haystack/setup.sh"
        )
    dsn = _ensure_database(settings, "concord_peer")
    with tempfile.TemporaryDirectory() as tmp:
        queries_file, out_file = Path(tmp) / "queries.json", Path(tmp) / "peer.json"
        queries_file.write_text(json.dumps(queries))
        completed = subprocess.run(
            [
                str(PEER_PYTHON),
                str(PEER_DIR / "run.py"),
                "--dataset", str(dataset_dir),
                "--queries", str(queries_file),
                "--model", settings.embedding_model_path(),
                "--es-url", settings.es_url(),
                "--pg-dsn", dsn,
                "--name", stem,
                "--out", str(out_file),
            ],
            stdout=sys.stderr,  # the peer's progress lines show next to Concord's
            check=False,
        )  # fmt: skip
        if completed.returncode != 0 or not out_file.exists():
            raise PeerUnavailable(f"the Haystack peer exited with {completed.returncode}")
        output = json.loads(out_file.read_text())
    runs = {
        f"haystack:{name}": RunResult(rankings=run["rankings"], latencies_ms=run["latencies_ms"])
        for name, run in output["configs"].items()
    }
    return runs, {"system": output["system"], "index_seconds": output["index_seconds"]}
