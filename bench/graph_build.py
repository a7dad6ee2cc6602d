"""HNSW graph build time of a placed tenant's partition at several build memories
(CONCORD_PG_GRAPH_BUILD_MEMORY, the build's maintenance_work_mem).

The graph is dropped and built again once per memory, the way placement builds it
(shared/stores/repository.py: build_hnsw_graph). Searches of the tenant are exact scans
meanwhile, so run it on a benchmark tenant (bench/query.py makes benchq-<size>):

    .venv/bin/python bench/graph_build.py --tenant benchq-100000 --memory 64MB,3GB
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.orm import Session

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shared.db import get_engine
from shared.stores import repository as repo
from shared.stores.partitions import GRAPH_LOCK_TIMEOUT_MS, partition_name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenant", required=True)
    parser.add_argument("--memory", default="64MB,3GB", help="comma-separated build memories")
    args = parser.parse_args()
    partition = partition_name(args.tenant)
    with get_engine().connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        if not connection.scalar(text("SELECT to_regclass(:p) IS NOT NULL"), {"p": partition}):
            raise SystemExit(f"{args.tenant} has no partition of its own (concord partitions)")
        rows = connection.scalar(text(f"SELECT count(*) FROM {partition}"))
        session = Session(bind=connection)
        for memory in args.memory.split(","):
            graph = f"{partition}_embedding_hnsw"
            connection.execute(text(f"DROP INDEX CONCURRENTLY IF EXISTS {graph}"))
            started = time.monotonic()
            repo.build_hnsw_graph(session, partition, GRAPH_LOCK_TIMEOUT_MS, memory)
            print(
                f"{args.tenant}: {rows} chunks, build memory {memory}: "
                f"{time.monotonic() - started:.1f} s",
                flush=True,
            )


if __name__ == "__main__":
    main()
