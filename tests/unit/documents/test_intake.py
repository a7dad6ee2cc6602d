"""Unit tests of the intake (shared/documents/intake.py, events.py) and the
schemathesis hook that reads forms as sent: no services."""

from __future__ import annotations

import pytest


def test_event_batcher_groups_by_count_and_by_content_size() -> None:
    from shared.documents import events as upload_event
    from shared.documents.events import EventBatcher

    sent: list[list[str]] = []
    batcher = EventBatcher(lambda events: sent.append([e["external_id"] for e in events]))
    small = [{"external_id": f"s{i}", "content_base64": "QQ=="} for i in range(40)]
    published = sum(batcher.add(e) for e in small)
    assert published == upload_event.EVENTS_PER_MESSAGE and len(sent) == 1
    big = {"external_id": "big", "content_base64": "Q" * upload_event.BYTES_PER_MESSAGE}
    assert batcher.add(big) == 40 - upload_event.EVENTS_PER_MESSAGE  # the big one goes alone
    assert batcher.flush() == 1 and batcher.flush() == 0
    assert [len(m) for m in sent] == [32, 8, 1] and sent[-1] == ["big"]


def test_the_schemathesis_hook_reads_a_form_as_sent_and_keeps_real_violations() -> None:
    from tests.e2e.schemathesis_hooks import form_as_sent_is_valid

    schema = {
        "type": "object",
        "required": ["file"],
        "properties": {
            "file": {"type": "string", "format": "binary", "minLength": 1},
            "title": {"type": "string", "maxLength": 1000},
        },
    }

    def form(*parts: tuple[str, bytes, str | None]) -> bytes:
        body = b""
        for name, value, filename in parts:
            disposition = f'form-data; name="{name}"' + (
                f'; filename="{filename}"' if filename else ""
            )
            body += f"--b\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + value + b"\r\n"
        return body + b"--b--\r\n"

    content_type = "multipart/form-data; boundary=b"
    upload = ("file", b"h+\xff", "file")
    # The case CI reported: a "number" title reaches the server as text.
    assert form_as_sent_is_valid(
        form(upload, ("title", b"-1.164545836139942e-293", None)), content_type, schema
    )
    assert not form_as_sent_is_valid(
        form(upload, ("title", b"t" * 1001, None)), content_type, schema
    )
    assert not form_as_sent_is_valid(form(("title", b"no file", None)), content_type, schema)
    assert not form_as_sent_is_valid(
        form(upload, ("title", b"short", None), ("title", b"t" * 1001, None)), content_type, schema
    )


def test_intake_bounds_stay_linear_and_refuse_with_a_4xx():
    """An unclosed JSON string full of escaped quotes made the string pattern rescan the rest
    of the input from every quote (quadratic); out-of-range dates and huge integers raised
    errors that were not 4xx."""
    import time

    from shared.documents.intake import check_json_structure, check_metadata
    from shared.errors import InvalidRequest
    from shared.fields import parse_iso_date
    from shared.stores.filters import _encode_date, range_terms

    def scan_time(n: int) -> float:
        # This process's CPU time, the best of three: the other processes of a busy machine
        # (the suite runs in parallel) stretch wall time, not this.
        times = []
        raw = b'"' + b'\\"' * n
        for _ in range(3):
            started = time.process_time()
            check_json_structure(raw, lines=False)
            times.append(time.process_time() - started)
        return min(times)

    small, large = scan_time(20_000), scan_time(200_000)
    assert large < max(small * 30, 0.05), (small, large)
    for value in ("0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00", "2024-13-45"):
        with pytest.raises(ValueError):
            parse_iso_date(value)
        with pytest.raises(InvalidRequest):
            check_metadata({"published": value})
    with pytest.raises(InvalidRequest):
        check_metadata({"n": 10**400})
    with pytest.raises(InvalidRequest):
        check_metadata({"k\n": 1})
    assert range_terms({"n": 10**400}) == []  # stored before the check: no range, no crash
    assert _encode_date("0999-01-01") < _encode_date("2024-01-01")
