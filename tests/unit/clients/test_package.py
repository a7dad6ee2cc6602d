"""The client package pulls none of the server's dependencies: its declared requirements,
their resolution by uv, and what importing it loads."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
CLIENT = ROOT / "clients" / "python"
SERVER_ONLY = {
    "torch",
    "sentence-transformers",
    "transformers",
    "sqlalchemy",
    "psycopg",
    "celery",
    "redis",
    "elasticsearch",
    "fastapi",
    "starlette",
    "uvicorn",
    "pgvector",
    "onnxruntime",
}


def _name(requirement: str) -> str:
    for stop in "<>=!~[; ":
        requirement = requirement.split(stop)[0]
    return requirement.lower().replace("_", "-")


def test_the_client_requires_httpx_and_pydantic_only():
    project = tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]
    assert {_name(r) for r in project["dependencies"]} == {"httpx", "pydantic"}


def test_the_resolved_dependencies_hold_no_server_package():
    uv = Path(sys.executable).parent / "uv"
    if not uv.exists():
        pytest.skip("uv is not installed (scripts/setup.sh installs it)")
    resolved = subprocess.run(
        [str(uv), "pip", "compile", "--quiet", "--no-header", str(CLIENT / "pyproject.toml")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    names = {_name(line) for line in resolved.splitlines() if line and not line.startswith(" ")}
    names.discard("#")
    assert {"httpx", "pydantic"} <= names
    assert not names & SERVER_ONLY, names & SERVER_ONLY


def test_importing_the_client_loads_no_server_module():
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, concord_client, concord_client.models; print(' '.join(sys.modules))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    roots = {name.split(".")[0].replace("_", "-") for name in loaded}
    assert not roots & (SERVER_ONLY | {"shared", "services", "workers"})
