"""Long-document benchmark: one document of ``--sections`` short Markdown sections (one chunk
each) through the real pipeline, in this process, with the shipped settings.

Prints the job's stage timings (parse, chunk, embed, write), the relay's time to carry every
chunk to Elasticsearch, and chunks/s end to end; checks that both stores hold every chunk.

    .venv/bin/concord stack up --infra-only
    .venv/bin/python bench/long_document.py --sections 30000
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path

from sqlalchemy import func, select

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shared.db import unit_of_work  # noqa: E402
from shared.documents.schemas import Upload  # noqa: E402
from shared.documents.service import accept_upload, delete_document  # noqa: E402
from shared.ingest import pipeline  # noqa: E402
from shared.models import Chunk, IngestJob  # noqa: E402
from shared.relay import service as relay  # noqa: E402
from shared.settings import get_settings  # noqa: E402
from shared.stores.compose import connect  # noqa: E402
from shared.stores.elastic import get_es  # noqa: E402


def long_markdown(sections: int) -> bytes:
    # The same shape as tests/integration/ingest/test_bounded_work.long_markdown: sections
    # of one chunk each (more than a stub, which would join its neighbour).
    return "".join(
        f"# Section {i}\nPart {i} of the long survey reports one more finding, the method "
        "that found it, and what its authors concluded from it in the end.\n"
        for i in range(sections)
    ).encode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sections", type=int, default=30_000)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/long_document.json")
    args = parser.parse_args()

    settings = get_settings()
    tenant = f"benchlong-{uuid.uuid4().hex[:8]}"
    raw = long_markdown(args.sections)
    with unit_of_work() as uow:
        result = accept_upload(
            uow,
            settings,
            Upload(tenant, "long.md", raw, "text/markdown"),
            queue=None,  # processed here, not by a worker
        )
    assert result.job_id is not None
    started = time.monotonic()
    pipeline.process_job(connect(), unit_of_work, result.job_id)
    processed_s = time.monotonic() - started
    relay_started = time.monotonic()
    relay.drain(connect(), unit_of_work, max_batches=10_000)
    relay_s = time.monotonic() - relay_started
    es, alias = get_es(), settings.es_chunks_alias()
    es.indices.refresh(index=alias)
    in_es = es.count(index=alias, query={"term": {"tenant_id": tenant}})["count"]
    with unit_of_work() as uow:
        job = uow.session.get(IngestJob, result.job_id)
        assert job is not None
        state, timings = job.state, dict(job.stage_timings or {})
        in_pg = (
            uow.session.scalar(
                select(func.count()).select_from(Chunk).where(Chunk.tenant_id == tenant)
            )
            or 0
        )
    assert state == "indexed" and in_pg == in_es == args.sections, (state, in_pg, in_es)
    total_s = processed_s + relay_s
    row = {
        "sections": args.sections,
        "bytes": len(raw),
        "chunks": in_pg,
        "job_s": round(processed_s, 2),
        "stage_s": {k: round(float(v), 2) for k, v in timings.items()},
        "relay_s": round(relay_s, 2),
        "chunks_per_s": round(in_pg / total_s, 1),
        "settings": "shipped defaults",
    }
    print(json.dumps(row))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(row, indent=2))
    # Clean up as a user would: delete the document (both stores, through the outbox).
    with unit_of_work() as uow:
        stores = connect()
        delete_document(
            uow, stores.vectors(uow.session), tenant, result.document_id, queue=stores.queue
        )
    relay.drain(connect(), unit_of_work, max_batches=10_000)


if __name__ == "__main__":
    main()
