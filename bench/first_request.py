"""The first requests after the API starts: how long until it answers, until its warm-up is
done (/readyz), and what the first and second PDF upload and search cost after that.

Starts an API process of its own (uvicorn, as the stack runs it) on a free port, against the
infrastructure of a running stack, and stops it again. Uploads go to a tenant of their own;
the worker need not run (an upload's answer is its acceptance, 202).

    .venv/bin/concord stack up --infra-only
    .venv/bin/python bench/first_request.py
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shared.db import unit_of_work  # noqa: E402
from shared.documents.schemas import Upload  # noqa: E402
from shared.documents.service import accept_upload  # noqa: E402
from shared.settings import get_settings  # noqa: E402
from shared.tenants.service import create_key  # noqa: E402

PDF = ROOT / "evaluation/devsets/real-docs/files/libtasn1.pdf"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _until(condition: object, timeout_s: float = 300) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        try:
            if condition():  # type: ignore[operator]
                return time.monotonic()
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"not within {timeout_s} s")


def _timed_ms(call: object) -> float:
    started = time.perf_counter()
    response = call()  # type: ignore[operator]
    response.raise_for_status()
    return (time.perf_counter() - started) * 1000


def main() -> None:
    tenant = f"first-{uuid.uuid4().hex[:8]}"
    with unit_of_work() as uow:
        _, secret = create_key(uow.session, tenant, "bench", ["read", "write"])
    with unit_of_work() as uow:  # the tenant's first document: a new tenant's costs apart
        accept_upload(
            uow,
            get_settings(),
            Upload(tenant_id=tenant, external_id="0.txt", raw=b"First.", content_type="text/plain"),
            queue=None,
        )
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    api = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "services.api.app:create_app", "--factory",
         "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        cwd=ROOT, env=os.environ.copy(),
    )  # fmt: skip
    try:
        answering = _until(lambda: httpx.get(f"{base}/healthz").status_code == 200)
        ready = _until(lambda: httpx.get(f"{base}/readyz").status_code == 200)
        warm_up = httpx.get(f"{base}/readyz").json()["checks"]["warm_up"]["detail"]
        headers = {"Authorization": f"Bearer {secret}"}
        with httpx.Client(base_url=base, headers=headers, timeout=60) as client:

            def upload(name: str) -> httpx.Response:
                files = {"file": (PDF.name, PDF.read_bytes(), "application/pdf")}
                return client.post("/v1/documents", files=files, data={"external_id": name})

            def search(query: str) -> httpx.Response:
                return client.post("/v1/search", json={"query": query})

            uploads = [_timed_ms(lambda: upload("a.pdf")), _timed_ms(lambda: upload("b.pdf"))]
            searches = [
                _timed_ms(lambda: search("how is a DER length encoded")),
                _timed_ms(lambda: search("what does asn1_create_element return")),
            ]
    finally:
        api.terminate()
        api.wait(30)
    print(f"API answering /healthz after {answering - started:.1f} s")
    print(f"API ready (/readyz 200) after {ready - started:.1f} s; warm-up {warm_up}")
    print(f"PDF upload ({PDF.stat().st_size // 1024} KiB): first {uploads[0]:.0f} ms, "
          f"second {uploads[1]:.0f} ms")  # fmt: skip
    print(f"search: first {searches[0]:.0f} ms, second {searches[1]:.0f} ms")


if __name__ == "__main__":
    main()
