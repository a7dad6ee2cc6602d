"""Upload events that delete, and content by reference: the JSON Schema file agrees with the
code on every case, a reference cannot leave the shared root, and a message mixing one
tenant's ordinary events with another tenant's bad ones harms only the bad ones."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest

from shared.documents.events import parse_event
from shared.errors import ConcordError
from shared.settings import get_settings

SCHEMA = json.loads((Path(__file__).parents[3] / "docs" / "upload-event.schema.json").read_text())
TEXT = base64.b64encode(b"Tides follow the moon.").decode()
BASE = {"schema": "concord.upload/v1", "tenant_id": "acme", "external_id": "tide.txt"}

# (event, valid?): what the schema file says and what the code does must be the same.
CASES: list[tuple[dict[str, Any], bool]] = [
    ({**BASE, "content_base64": TEXT}, True),
    ({**BASE, "action": "upsert", "content_base64": TEXT, "title": "Tides"}, True),
    ({**BASE, "content_path": "notes/tide.txt"}, True),
    ({**BASE, "action": "delete"}, True),
    ({**BASE}, False),  # an upsert without content
    ({**BASE, "content_base64": TEXT, "content_path": "notes/tide.txt"}, False),  # both
    ({**BASE, "action": "delete", "content_base64": TEXT}, False),  # a delete with content
    ({**BASE, "action": "rename", "content_base64": TEXT}, False),
    ({**BASE, "content_path": "/etc/passwd"}, False),
    ({**BASE, "schema": "concord.upload/v0", "content_base64": TEXT}, False),
    ({**BASE, "tenant_id": "Not A Tenant", "action": "delete"}, False),
    ({**BASE, "external_id": "", "content_base64": TEXT}, False),
    ({**BASE, "content_base64": TEXT, "colour": "blue"}, False),
]


@pytest.mark.parametrize(("event", "valid"), CASES)
def test_the_schema_file_and_the_code_agree(
    event: dict[str, Any], valid: bool, content_root: Path
) -> None:
    assert jsonschema_rs.validator_for(SCHEMA).is_valid(event) is valid
    if valid:
        parse_event(event, get_settings())
    else:
        with pytest.raises(ConcordError) as refused:
            parse_event(event, get_settings())
        assert 400 <= refused.value.status_code < 500


def test_a_reference_stays_in_its_tenants_directory(content_root: Path, tmp_path: Path) -> None:
    own = content_root / "acme"
    secret = tmp_path / "secret.txt"
    secret.write_text("not for indexing")
    os.symlink(secret, own / "link.txt")
    os.symlink(tmp_path, own / "linked-dir")
    os.mkfifo(own / "pipe")
    (own / "big.txt").write_bytes(b"x" * (get_settings().max_upload_bytes + 1))
    (content_root / "other").mkdir()
    (content_root / "other" / "theirs.txt").write_text("another tenant's file")
    refused = {
        "../secret.txt": (400, "relative"),
        "notes/../../other/theirs.txt": (400, "relative"),
        "theirs.txt": (404, "does not exist"),  # another tenant's file is not in reach
        "link.txt": (400, "link"),
        "linked-dir/secret.txt": (400, "link"),
        "pipe": (400, "not a regular file"),  # refused at once, never blocking the worker
        "notes": (400, "not a regular file"),
        "missing.txt": (404, "does not exist"),
        "big.txt": (413, "limit"),
    }
    for path, (status, words) in refused.items():
        with pytest.raises(ConcordError) as error:
            parse_event({**BASE, "content_path": path}, get_settings())
        assert (error.value.status_code, words in error.value.message) == (status, True), path
    upload = parse_event({**BASE, "content_path": "notes/tide.txt"}, get_settings())
    assert getattr(upload, "raw", None) == b"Tides follow the moon."


def test_content_by_reference_is_refused_when_no_root_is_configured(monkeypatch) -> None:
    monkeypatch.setattr(get_settings(), "ingest_content_root", "")
    with pytest.raises(ConcordError, match="CONCORD_INGEST_CONTENT_ROOT"):
        parse_event({**BASE, "content_path": "notes/tide.txt"}, get_settings())
