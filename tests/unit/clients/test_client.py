"""The client's own behaviour on a scripted transport (httpx.MockTransport): retries honour
Retry-After, errors carry the server's body, cursors and job waits are followed. The same
calls against the real API are in tests/e2e/test_integrations.py."""

from __future__ import annotations

import asyncio
import json
import uuid

import httpx
import pytest
from concord_client import (
    AsyncConcord,
    BadRequest,
    Concord,
    ConcordError,
    JobFailed,
    JobTimeout,
    NotFound,
    PermissionDenied,
    RateLimited,
    RetryPolicy,
    ServiceUnavailable,
)

SEARCH = {
    "query": "q",
    "mode": "hybrid",
    "degraded": [],
    "dropped_stale": 0,
    "decision": {
        "status": "answerable",
        "reason": None,
        "score_type": "dense_cosine",
        "threshold": 0.3,
        "top_score": 0.8,
    },
    "results": [],
    "evidence": {"items": [], "omitted": [], "token_budget": 100, "tokens_used": 0},
}


def _error(status: int, code: str, message: str, **headers: str) -> httpx.Response:
    return httpx.Response(
        status, json={"error": {"code": code, "message": message}}, headers=headers
    )


def _accepted() -> httpx.Response:
    return httpx.Response(
        202,
        json={
            "document_id": str(uuid.uuid4()),
            "version": 1,
            "job_id": str(uuid.uuid4()),
            "status": "accepted",
        },
    )


def _job(state: str, **extra) -> dict:
    return {
        "id": str(uuid.uuid4()),
        "kind": "ingest",
        "document_id": str(uuid.uuid4()),
        "version": 1,
        "state": state,
        "attempts": 1,
        "error": None,
        "stage_timings": {},
        "detail": {},
        "created_at": "2026-12-06T00:00:00Z",
        "started_at": None,
        "finished_at": None,
        **extra,
    }


class Script:
    """Answers requests in order and records them, and the sleeps the client asks for."""

    def __init__(self, *answers: httpx.Response | Exception) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []
        self.sleeps: list[float] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def client(self, **options) -> Concord:
        http = httpx.Client(transport=httpx.MockTransport(self), base_url="http://concord")
        return Concord(http_client=http, api_key="ck_test", sleep=self.sleeps.append, **options)


def test_a_429_is_retried_after_the_servers_retry_after():
    script = Script(
        _error(429, "rate_limited", "slow down", **{"Retry-After": "2"}),
        httpx.Response(200, json=SEARCH),
    )
    response = script.client().search("q", top_k=3)
    assert response.decision.status == "answerable"
    assert script.sleeps == [2.0]
    assert [r.headers["authorization"] for r in script.requests] == ["Bearer ck_test"] * 2
    assert json.loads(script.requests[0].content) == {"query": "q", "top_k": 3}


def test_a_503_past_the_retries_raises_with_the_servers_body():
    script = Script(*[_error(503, "store_unavailable", "Postgres is unavailable")] * 3)
    with pytest.raises(ServiceUnavailable) as raised:
        script.client(retry=RetryPolicy(max_retries=2, backoff_s=0.1)).search("q")
    assert raised.value.status_code == 503
    assert raised.value.code == "store_unavailable"
    assert raised.value.message == "Postgres is unavailable"
    assert len(script.requests) == 3 and len(script.sleeps) == 2
    assert all(0 < s <= 30 for s in script.sleeps)


@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, BadRequest), (403, PermissionDenied), (404, NotFound), (422, BadRequest)],
)
def test_a_refusal_of_the_request_itself_is_raised_at_once(status, kind):
    script = Script(_error(status, "nope", "the reason"))
    with pytest.raises(kind, match="the reason"):
        script.client().get_document(uuid.uuid4())
    assert len(script.requests) == 1 and script.sleeps == []


def test_a_rate_limit_that_lasts_is_raised_as_rate_limited():
    script = Script(*[_error(429, "rate_limited", "slow down", **{"Retry-After": "1"})] * 2)
    with pytest.raises(RateLimited) as raised:
        script.client(retry=RetryPolicy(max_retries=1)).search("q")
    assert raised.value.retry_after == 1.0


def test_an_upload_is_not_sent_again_after_a_timeout_but_a_search_is():
    """The server may have accepted an upload whose answer timed out; a search is safe to
    repeat. A connection never made is retried for both."""
    timeout = httpx.ReadTimeout("timed out")
    upload = Script(timeout)
    with pytest.raises(ConcordError, match="ReadTimeout"):
        upload.client().upload_text("doc", "text")
    assert len(upload.requests) == 1

    search = Script(timeout, httpx.Response(200, json=SEARCH))
    assert search.client().search("q").query == "q"

    refused = Script(
        httpx.ConnectError("refused"),
        _accepted(),
    )
    assert refused.client().upload_text("doc", "text").status == "accepted"


def test_a_misspelt_search_option_fails_before_anything_is_sent():
    script = Script()
    with pytest.raises(ValueError, match="top_kk"):
        script.client().search("q", top_kk=3)
    assert script.requests == []


def test_search_pages_follow_the_cursor_to_the_end():
    script = Script(
        httpx.Response(200, json={**SEARCH, "next_cursor": "cursor-1"}),
        httpx.Response(200, json={**SEARCH, "next_cursor": "cursor-2"}),
        httpx.Response(200, json={**SEARCH, "next_cursor": None}),
    )
    pages = list(script.client().search_pages("q", top_k=2))
    assert len(pages) == 3
    assert json.loads(script.requests[0].content)["paginate"] is True
    assert [json.loads(r.content) for r in script.requests[1:]] == [
        {"cursor": "cursor-1"},
        {"cursor": "cursor-2"},
    ]


def test_wait_for_job_polls_until_indexed_and_raises_for_a_failed_one():
    script = Script(
        httpx.Response(200, json=_job("queued")), httpx.Response(200, json=_job("indexed"))
    )
    assert script.client().wait_for_job("j", poll_interval=0.25).state == "indexed"
    assert script.sleeps == [0.25]

    failed = Script(
        httpx.Response(
            200,
            json=_job(
                "failed", error={"class": "ParseError", "message": "not a PDF", "stage": "parse"}
            ),
        )
    )
    with pytest.raises(JobFailed, match="not a PDF"):
        failed.client().wait_for_job("j")

    slow = Script(httpx.Response(200, json=_job("running")))
    with pytest.raises(JobTimeout):
        slow.client().wait_for_job("j", timeout=0)


def test_a_file_upload_is_multipart_with_its_name_and_metadata(tmp_path):
    path = tmp_path / "notes.md"
    path.write_text("# Notes\n\nbody")
    script = Script(_accepted())
    script.client().upload_file(path, metadata={"team": "ops"})
    body = script.requests[0].content
    assert b'filename="notes.md"' in body
    assert b'name="metadata"' in body and b'{"team": "ops"}' in body
    assert script.requests[0].headers["content-type"].startswith("multipart/form-data")


def test_the_async_client_retries_and_raises_alike():
    async def main() -> None:
        script = Script(
            _error(503, "store_unavailable", "down", **{"Retry-After": "0"}),
            httpx.Response(200, json=SEARCH),
        )
        sleeps: list[float] = []

        async def sleep(seconds: float) -> None:
            sleeps.append(seconds)

        http = httpx.AsyncClient(transport=httpx.MockTransport(script), base_url="http://concord")
        async with AsyncConcord(http_client=http, api_key="k", sleep=sleep) as client:
            assert (await client.search("q")).query == "q"
            script.answers.append(_error(404, "not_found", "no such document"))
            with pytest.raises(NotFound):
                await client.get_document(uuid.uuid4())
        assert sleeps == [0.0]

    asyncio.run(main())


def test_a_proxys_504_is_not_a_reason_to_send_an_upload_again():
    """A gateway timeout may come after the server committed the upload; a search is safe."""
    gateway = _error(504, "http_error", "gateway timeout")
    upload = Script(gateway)
    with pytest.raises(ServiceUnavailable):
        upload.client().upload_text("doc", "text")
    assert len(upload.requests) == 1

    search = Script(gateway, httpx.Response(200, json=SEARCH))
    assert search.client().search("q").query == "q"
    assert len(search.requests) == 2


def test_a_retry_after_past_the_longest_wait_is_raised_not_cut_short():
    script = Script(_error(429, "rate_limited", "slow down", **{"Retry-After": "120"}))
    with pytest.raises(RateLimited) as raised:
        script.client().search("q")
    assert raised.value.retry_after == 120.0
    assert script.sleeps == [] and len(script.requests) == 1


def test_an_id_is_one_path_segment_whatever_it_holds():
    script = Script(*[_error(422, "invalid_request", "not a UUID")] * 2)
    client = script.client()
    for sneaky in ("../admin/keys/k1", ".."):
        with pytest.raises(BadRequest):
            client.delete_document(sneaky)
    paths = [r.url.raw_path.decode() for r in script.requests]
    assert paths == ["/v1/documents/%2E%2E%2Fadmin%2Fkeys%2Fk1", "/v1/documents/%2E%2E"]


def test_options_given_with_a_request_object_are_checked_too():
    from concord_client.models import SearchRequest

    script = Script()
    with pytest.raises(ValueError, match="top_k"):
        script.client().search(SearchRequest(query="q"), top_k="many")
    assert script.requests == []


def test_waiting_for_an_upload_that_changed_nothing_returns_at_once():
    from concord_client.models import UploadAccepted

    unchanged = UploadAccepted(document_id=uuid.uuid4(), version=3, job_id=None, status="unchanged")
    script = Script()
    assert script.client().wait_for_job(unchanged) is None
    assert script.requests == []
