"""What each operation sends and how its answer is read, written once for the sync and the
async client (which differ only in how they send): a ``Call`` per operation, and the retry
policy both follow."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Generic, TypeVar
from urllib.parse import quote
from uuid import UUID

import httpx
from pydantic import TypeAdapter

from concord_client.errors import retry_after_seconds
from concord_client.models import (
    ChunkList,
    DocumentDeleted,
    DocumentList,
    DocumentView,
    IngestJobView,
    SearchPage,
    SearchRequest,
    SearchResponse,
    TextDocument,
    TrainingJobView,
    UploadAccepted,
)

T = TypeVar("T")
# Statuses that say the server did nothing: a 429 is refused at the door, and a 503 rolled
# its transaction back. Any request may be sent again after one.
REFUSED_UNDONE = frozenset({429, 503})
DEFAULT_URL = "http://127.0.0.1:18000"
# A job in one of these states will not change again by itself.
FINAL_JOB_STATES = frozenset({"indexed", "failed", "dead_lettered"})
FileInput = str | os.PathLike[str] | bytes | IO[bytes]

_JOB = TypeAdapter(IngestJobView | TrainingJobView)


@dataclass(frozen=True)
class Call(Generic[T]):
    """One HTTP request and the reading of its JSON answer."""

    method: str
    path: str
    read: Callable[[Any], T]
    json: Any = None
    params: Mapping[str, Any] | None = None
    files: Mapping[str, Any] | None = None
    data: Mapping[str, Any] | None = None

    @property
    def idempotent(self) -> bool:
        """May be sent again after the connection broke mid-request (an upload may not: the
        server may have accepted it; a refusal with 429 or 503 is safe to repeat for any)."""
        return self.method in ("GET", "DELETE") or self.path.startswith("/v1/search")

    def request_options(self) -> dict[str, Any]:
        return {
            key: value
            for key, value in (
                ("json", self.json),
                ("params", self.params),
                ("files", self.files),
                ("data", self.data),
            )
            if value is not None
        }


@dataclass(frozen=True)
class RetryPolicy:
    """Retries of a refused or failed request: 429 and 503 (and 502/504 from a proxy) after the
    server's ``Retry-After`` when it sends one, else after an exponential backoff with jitter;
    a connection that could not be made, for every request; a broken or timed-out one, for
    requests safe to repeat (``Call.idempotent``)."""

    max_retries: int = 3
    backoff_s: float = 0.5
    max_delay_s: float = 30.0
    retry_statuses: frozenset[int] = field(default_factory=lambda: frozenset({429, 502, 503, 504}))

    def backoff(self, attempt: int) -> float:
        return float(min(self.max_delay_s, self.backoff_s * 2**attempt * random.uniform(0.5, 1.5)))

    def after_response(
        self, call: Call[Any], response: httpx.Response, attempt: int
    ) -> float | None:
        """Seconds to wait before sending again, or None to raise the error now. A 502 or
        504 from a proxy may come after the server accepted the request: only a call safe
        to repeat is sent again after one. A ``Retry-After`` longer than ``max_delay_s`` is
        raised, not cut short (the retry would only be refused again)."""
        status = response.status_code
        if attempt >= self.max_retries or status not in self.retry_statuses:
            return None
        if status not in REFUSED_UNDONE and not call.idempotent:
            return None
        retry_after = retry_after_seconds(response)
        if retry_after is not None:
            return retry_after if retry_after <= self.max_delay_s else None
        return self.backoff(attempt)

    def after_transport_error(
        self, call: Call[Any], error: httpx.TransportError, attempt: int
    ) -> float | None:
        if attempt >= self.max_retries:
            return None
        if isinstance(error, httpx.ConnectError | httpx.ConnectTimeout) or call.idempotent:
            return self.backoff(attempt)
        return None


def search(request: SearchRequest) -> Call[SearchResponse]:
    return Call(
        "POST",
        "/v1/search",
        SearchResponse.model_validate,
        json=request.model_dump(mode="json", exclude_unset=True),
    )


def search_request(query: str | SearchRequest, options: Mapping[str, Any]) -> SearchRequest:
    """A search's request from a query and keyword options (``top_k=5, mode="lexical"``),
    checked here: a misspelt option fails before anything is sent."""
    if isinstance(query, SearchRequest):
        return SearchRequest.model_validate({**query.model_dump(exclude_unset=True), **options})
    return SearchRequest.model_validate({"query": query, **options})


def next_page(cursor: str) -> Call[SearchResponse]:
    return Call(
        "POST",
        "/v1/search/next",
        SearchResponse.model_validate,
        json=SearchPage(cursor=cursor).model_dump(mode="json"),
    )


def upload_text(
    external_id: str,
    text: str,
    *,
    title: str | None,
    metadata: Mapping[str, Any] | None,
    content_type: str | None,
) -> Call[UploadAccepted]:
    fields = {"title": title, "metadata": metadata, "content_type": content_type}
    document = TextDocument.model_validate(
        {
            "external_id": external_id,
            "text": text,
            **{name: value for name, value in fields.items() if value is not None},
        }
    )
    return Call(
        "POST",
        "/v1/documents",
        UploadAccepted.model_validate,
        json=document.model_dump(mode="json", exclude_unset=True),
    )


def upload_file(
    file: FileInput,
    *,
    external_id: str | None,
    filename: str | None,
    title: str | None,
    metadata: Mapping[str, Any] | None,
    content_type: str | None,
) -> Call[UploadAccepted]:
    """A multipart upload. The content is read into memory first, so that a retry sends the
    same bytes (the server's upload limit bounds its size)."""
    if isinstance(file, bytes):
        content = file
    elif isinstance(file, str | os.PathLike):
        path = Path(file)
        content = path.read_bytes()
        filename = filename or path.name
    else:
        content = file.read()
        filename = filename or Path(getattr(file, "name", "") or "upload").name
    if not filename and not external_id:
        raise ValueError("give external_id or filename for an upload of bytes")
    form: dict[str, str] = {}
    if external_id is not None:
        form["external_id"] = external_id
    if title is not None:
        form["title"] = title
    if metadata is not None:
        form["metadata"] = json.dumps(dict(metadata))
    part = (
        filename or external_id or "upload",
        content,
        content_type or "application/octet-stream",
    )
    return Call(
        "POST", "/v1/documents", UploadAccepted.model_validate, files={"file": part}, data=form
    )


def get_job(job_id: UUID | str) -> Call[IngestJobView | TrainingJobView]:
    return Call("GET", f"/v1/jobs/{_segment(job_id)}", _JOB.validate_python)


def list_documents(limit: int, after: str | None, deleted: bool) -> Call[DocumentList]:
    params: dict[str, Any] = {"limit": limit, "deleted": str(deleted).lower()}
    if after is not None:
        params["after"] = after
    return Call("GET", "/v1/documents", DocumentList.model_validate, params=params)


def get_document(document_id: UUID | str, include_deleted: bool) -> Call[DocumentView]:
    return Call(
        "GET",
        f"/v1/documents/{_segment(document_id)}",
        DocumentView.model_validate,
        params={"include_deleted": str(include_deleted).lower()},
    )


def document_chunks(document_id: UUID | str, section: str | None) -> Call[ChunkList]:
    params = {"section": section} if section is not None else None
    return Call(
        "GET",
        f"/v1/documents/{_segment(document_id)}/chunks",
        ChunkList.model_validate,
        params=params,
    )


def delete_document(document_id: UUID | str) -> Call[DocumentDeleted]:
    return Call("DELETE", f"/v1/documents/{_segment(document_id)}", DocumentDeleted.model_validate)


def _segment(identifier: UUID | str) -> str:
    """An id as one path segment: "../admin/keys/K" must not become another route (the
    slashes and dots encoded, so that no dot segment is left for URL normalization)."""
    return quote(str(identifier), safe="").replace(".", "%2E")


def auth_headers(api_key: str | None) -> dict[str, str]:
    key = api_key if api_key is not None else os.environ.get("CONCORD_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def base_url(url: str | None) -> str:
    return url or os.environ.get("CONCORD_URL") or DEFAULT_URL
