"""The synchronous client. ``AsyncConcord`` (async_client.py) has the same methods, awaited."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from types import TracebackType
from typing import Any, TypeVar, overload
from uuid import UUID

import httpx

from concord_client import _calls
from concord_client._calls import FINAL_JOB_STATES, Call, FileInput, RetryPolicy
from concord_client.errors import ConcordError, JobFailed, JobTimeout, error_from
from concord_client.models import (
    ChunkList,
    DocumentDeleted,
    DocumentList,
    DocumentSummary,
    DocumentView,
    IngestJobView,
    SearchRequest,
    SearchResponse,
    TrainingJobView,
    UploadAccepted,
)

T = TypeVar("T")


class Concord:
    """A client of one Concord API for one API key (the key decides the tenant).

    ``base_url`` defaults to ``$CONCORD_URL`` (else http://127.0.0.1:18000) and ``api_key`` to
    ``$CONCORD_API_KEY``. Pass ``http_client`` to bring your own ``httpx.Client`` (proxies,
    certificates, a test's transport); the client then does not close it."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        http_client: httpx.Client | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._owns_http = http_client is None
        self._http = http_client or httpx.Client(
            base_url=_calls.base_url(base_url), timeout=timeout
        )
        self._headers = _calls.auth_headers(api_key)
        self._retry = retry or RetryPolicy()
        self._sleep = sleep

    def __enter__(self) -> Concord:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def _send(self, call: Call[T]) -> T:
        attempt = 0
        while True:
            try:
                response = self._http.request(
                    call.method, call.path, headers=self._headers, **call.request_options()
                )
            except httpx.TransportError as e:
                delay = self._retry.after_transport_error(call, e, attempt)
                if delay is None:
                    raise ConcordError(f"{call.method} {call.path}: {type(e).__name__}: {e}") from e
            else:
                if response.is_success:
                    return call.read(response.json())
                delay = self._retry.after_response(call, response, attempt)
                if delay is None:
                    raise error_from(response)
            self._sleep(delay)
            attempt += 1

    # -- search -------------------------------------------------------------------------

    def search(self, query: str | SearchRequest, **options: Any) -> SearchResponse:
        """One search: ``search("how do I descale a kettle", top_k=5, mode="hybrid")``; the
        options are the fields of ``SearchRequest`` (checked before sending)."""
        return self._send(_calls.search(_calls.search_request(query, options)))

    def next_page(self, cursor: str) -> SearchResponse:
        """The page after a paginated search's page (``response.next_cursor``)."""
        return self._send(_calls.next_page(cursor))

    def search_pages(self, query: str | SearchRequest, **options: Any) -> Iterator[SearchResponse]:
        """Every page of a search, ``top_k`` results each, following the cursor until the
        ranking is exhausted; every page is decided like the first."""
        page = self.search(query, **{**options, "paginate": True})
        yield page
        while page.next_cursor:
            page = self.next_page(page.next_cursor)
            yield page

    # -- documents ----------------------------------------------------------------------

    def upload_text(
        self,
        external_id: str,
        text: str,
        *,
        title: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        content_type: str | None = None,
    ) -> UploadAccepted:
        """Add a text document (or a new version of ``external_id``); its job indexes it."""
        return self._send(
            _calls.upload_text(
                external_id, text, title=title, metadata=metadata, content_type=content_type
            )
        )

    def upload_file(
        self,
        file: FileInput,
        *,
        external_id: str | None = None,
        filename: str | None = None,
        title: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        content_type: str | None = None,
    ) -> UploadAccepted:
        """Upload a file (a path, bytes or a binary file object) of any supported format; the
        server reads its type from its bytes. ``external_id`` defaults to its file name."""
        return self._send(
            _calls.upload_file(
                file,
                external_id=external_id,
                filename=filename,
                title=title,
                metadata=metadata,
                content_type=content_type,
            )
        )

    def get_job(self, job_id: UUID | str) -> IngestJobView | TrainingJobView:
        return self._send(_calls.get_job(job_id))

    @overload
    def wait_for_job(
        self, job: UUID | str, *, timeout: float = ..., poll_interval: float = ...
    ) -> IngestJobView: ...

    @overload
    def wait_for_job(
        self, job: UploadAccepted, *, timeout: float = ..., poll_interval: float = ...
    ) -> IngestJobView | None: ...

    def wait_for_job(
        self,
        job: UploadAccepted | UUID | str,
        *,
        timeout: float = 300.0,
        poll_interval: float = 0.5,
    ) -> IngestJobView | None:
        """Poll an ingest job (its id, or an upload's answer) until it is indexed;
        ``JobFailed`` if it fails, ``JobTimeout`` if it is still queued or running after
        ``timeout`` seconds. None for an upload that changed nothing and started no job."""
        if isinstance(job, UploadAccepted):
            if job.job_id is None:
                return None
            job = job.job_id
        deadline = time.monotonic() + timeout
        while True:
            view = self.get_job(job)
            if not isinstance(view, IngestJobView):
                raise ConcordError(f"job {job} is a reranker training, not an ingest job")
            if view.state in FINAL_JOB_STATES:
                if view.state != "indexed":
                    raise JobFailed(view)
                return view
            if time.monotonic() >= deadline:
                raise JobTimeout(view, timeout)
            self._sleep(poll_interval)

    def list_documents(
        self, *, limit: int = 100, after: str | None = None, deleted: bool = False
    ) -> DocumentList:
        return self._send(_calls.list_documents(limit, after, deleted))

    def iter_documents(
        self, *, page_size: int = 100, deleted: bool = False
    ) -> Iterator[DocumentSummary]:
        """Every document of the tenant, by external id, a page at a time."""
        after = None
        while True:
            page = self.list_documents(limit=page_size, after=after, deleted=deleted)
            yield from page.documents
            if not page.next_after:
                return
            after = page.next_after

    def get_document(
        self, document_id: UUID | str, *, include_deleted: bool = False
    ) -> DocumentView:
        return self._send(_calls.get_document(document_id, include_deleted))

    def document_chunks(self, document_id: UUID | str, *, section: str | None = None) -> ChunkList:
        return self._send(_calls.document_chunks(document_id, section))

    def delete_document(self, document_id: UUID | str) -> DocumentDeleted:
        return self._send(_calls.delete_document(document_id))
