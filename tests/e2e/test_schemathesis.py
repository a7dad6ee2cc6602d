"""schemathesis against the served OpenAPI document, with two tenants' keys as peers: every
check (status codes, schemas, content types, Allow headers, positive and negative data,
use-after-free, ignored auth, object-level authorization), the stateful phase included, over
real HTTP to the real stack. The run's report is kept under ``test-artifacts/schemathesis``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.helpers import new_key

ARTIFACTS = Path(os.environ.get("CONCORD_TEST_ARTIFACTS", "test-artifacts")) / "schemathesis"
HOOKS = Path(__file__).with_name("schemathesis_hooks.py")  # drops one false positive; see there
MAX_EXAMPLES = int(os.environ.get("CONCORD_SCHEMATHESIS_EXAMPLES", "40"))

CONFIG = """
[auth.wfc]
path = "{auth}"
peers = ["tenant-a", "tenant-b"]

[[operations]]
include-path = "/v1/documents"
include-method = "POST"
# An upload's bytes are screened by content (magic bytes, whether it parses) and a form's
# metadata part must hold a JSON object; a schema cannot say "a PDF that parses", so a
# schema-valid upload may still be refused, with a 4xx that says why.
checks.positive_data_acceptance.expected-statuses = ["2xx", 400, 401, 403, 404, 409, 415, 422, 429]
"""


@pytest.mark.usefixtures("worker")
def test_schemathesis_finds_no_failures_with_two_tenants(
    live_api: str, client: TestClient, tmp_path: Path
) -> None:
    keys = {name: new_key(f"st-{name}", ["read", "write", "admin"]) for name in ("a", "b")}
    for key in keys.values():  # the same document in both tenants: ids are the only difference
        response = client.post(
            "/v1/documents",
            json={"external_id": "same", "title": "Same", "text": "identical glacier notes"},
            headers={"Authorization": f"Bearer {key}"},
        )
        assert response.status_code in (200, 202), response.text
    auth = tmp_path / "auth.json"
    auth.write_text(
        json.dumps(
            {
                "auth": [
                    {
                        "name": f"tenant-{name}",
                        "fixedHeaders": [{"name": "Authorization", "value": f"Bearer {key}"}],
                    }
                    for name, key in keys.items()
                ]
            }
        )
    )
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG.format(auth=auth))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    run = subprocess.run(
        [
            str(Path(sys.executable).parent / "schemathesis"),
            "--config-file",
            str(config),
            "run",
            f"{live_api}/openapi.json",
            "--checks",
            "all",
            "--max-examples",
            str(MAX_EXAMPLES),
            # One worker: schemathesis' workers are threads, and on Python 3.11 `ast.parse`
            # in two threads at once can fail inside CPython ("AST constructor recursion
            # depth mismatch", cpython gh-106905), which hypothesis calls to describe filters.
            "--workers",
            "1",
            "--report",
            "junit",
            "--report-dir",
            str(ARTIFACTS),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "SCHEMATHESIS_HOOKS": str(HOOKS)},
        cwd=tmp_path,
    )
    (ARTIFACTS / "output.txt").write_text(run.stdout + run.stderr)
    summary = run.stdout[run.stdout.rfind("SUMMARY") :]
    print(summary)
    assert run.returncode == 0, run.stdout[-6000:]
    # Every operation of the document was exercised, not just the ones that were easy to reach.
    operations = sum(
        len([m for m in item if m in ("get", "post", "put", "delete", "patch")])
        for item in client.get("/openapi.json").json()["paths"].values()
    )
    tested = re.search(r"Tested: (\d+)", summary)
    assert tested is not None and int(tested.group(1)) == operations, summary
