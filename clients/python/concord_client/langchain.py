"""A LangChain retriever over Concord's search (``pip install 'concord-client[langchain]'``)::

retriever = ConcordRetriever(k=5)          # $CONCORD_URL and $CONCORD_API_KEY
docs = retriever.invoke("how do I descale a kettle")
docs[0].metadata["decision"]               # "answerable", "verify" or "abstain"
"""

from __future__ import annotations

from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict, Field, SecretStr

from concord_client.async_client import AsyncConcord
from concord_client.client import Concord
from concord_client.models import SearchResponse
from concord_client.provenance import result_metadata


class ConcordRetriever(BaseRetriever):
    """Concord's hybrid search as LangChain ``Document``\\s: the passage as ``page_content``,
    its provenance, scores and the search's decision in ``metadata``.

    ``k`` results (also an ``invoke`` keyword); ``search_options`` are any other fields of
    Concord's search request (``{"mode": "lexical", "filters": {...}, "profile": "docs"}``).
    With ``drop_abstained`` a search Concord abstains on returns no documents, so a chain
    cannot answer from passages that do not hold the answer."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    base_url: str | None = None
    api_key: SecretStr | None = None
    k: int = Field(default=4, ge=1, le=100)
    search_options: dict[str, Any] = Field(default_factory=dict)
    drop_abstained: bool = False
    client: Concord | None = Field(default=None, exclude=True)
    async_client: AsyncConcord | None = Field(default=None, exclude=True)

    def _sync_client(self) -> Concord:
        if self.client is None:
            self.client = Concord(self.base_url, _secret(self.api_key))
        return self.client

    def _options(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        return {**self.search_options, "top_k": kwargs.pop("k", self.k), **kwargs}

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun, **kwargs: Any
    ) -> list[Document]:
        return self._documents(self._sync_client().search(query, **self._options(kwargs)))

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun, **kwargs: Any
    ) -> list[Document]:
        if self.async_client is not None:
            response = await self.async_client.search(query, **self._options(kwargs))
        else:  # one per call: an async client belongs to the event loop it was made on
            async with AsyncConcord(self.base_url, _secret(self.api_key)) as client:
                response = await client.search(query, **self._options(kwargs))
        return self._documents(response)

    def _documents(self, response: SearchResponse) -> list[Document]:
        if self.drop_abstained and response.decision.status == "abstain":
            return []
        return [
            Document(
                id=result.chunk_id,
                page_content=result.text,
                metadata=result_metadata(result, response, rank),
            )
            for rank, result in enumerate(response.results, start=1)
        ]


def _secret(value: SecretStr | None) -> str | None:
    return value.get_secret_value() if value is not None else None
