"""A LlamaIndex retriever over Concord's search (``pip install 'concord-client[llamaindex]'``)::

retriever = ConcordLlamaIndexRetriever(Concord(), top_k=5)
nodes = retriever.retrieve("how do I descale a kettle")
nodes[0].node.metadata["decision"]        # "answerable", "verify" or "abstain"
"""

from __future__ import annotations

from typing import Any

from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from concord_client.async_client import AsyncConcord
from concord_client.client import Concord
from concord_client.models import SearchResponse
from concord_client.provenance import result_metadata


class ConcordLlamaIndexRetriever(BaseRetriever):
    """Concord's hybrid search as LlamaIndex ``NodeWithScore``\\s: each passage a ``TextNode``
    (its id the chunk id) with its provenance, scores and the search's decision in
    ``metadata``, scored by the score Concord ranked it by.

    ``base_url`` and ``api_key`` (default ``$CONCORD_URL``, ``$CONCORD_API_KEY``) make the
    clients it needs, or pass your own; ``search_options`` are any other fields of Concord's
    search request; with ``drop_abstained`` a search Concord abstains on returns no nodes."""

    def __init__(
        self,
        client: Concord | None = None,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        async_client: AsyncConcord | None = None,
        top_k: int = 4,
        search_options: dict[str, Any] | None = None,
        drop_abstained: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._client = client
        self._async_client = async_client
        self._base_url = base_url
        self._api_key = api_key
        self._top_k = top_k
        self._search_options = dict(search_options or {})
        self._drop_abstained = drop_abstained

    def _options(self) -> dict[str, Any]:
        return {**self._search_options, "top_k": self._top_k}

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        if self._client is None:
            self._client = Concord(self._base_url, self._api_key)
        return self._nodes(self._client.search(query_bundle.query_str, **self._options()))

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        query = query_bundle.query_str
        if self._async_client is not None:
            response = await self._async_client.search(query, **self._options())
        else:  # one per call: an async client belongs to the event loop it was made on
            async with AsyncConcord(self._base_url, self._api_key) as client:
                response = await client.search(query, **self._options())
        return self._nodes(response)

    def _nodes(self, response: SearchResponse) -> list[NodeWithScore]:
        if self._drop_abstained and response.decision.status == "abstain":
            return []
        return [
            NodeWithScore(
                node=_node(result_metadata(result, response, rank), result.text), score=result.score
            )
            for rank, result in enumerate(response.results, start=1)
        ]


# Provenance is for the application, not for the LLM's prompt or an embedding.
_NOT_FOR_THE_LLM = ["scores", "found_by", "rank", "char_start", "char_end", "indexed_at", "version"]


def _node(metadata: dict[str, Any], text: str) -> TextNode:
    return TextNode(
        id_=metadata["chunk_id"],
        text=text,
        metadata=metadata,
        excluded_llm_metadata_keys=_NOT_FOR_THE_LLM,
        excluded_embed_metadata_keys=list(metadata),
    )
