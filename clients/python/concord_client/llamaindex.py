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

    ``search_options`` are any other fields of Concord's search request; with
    ``drop_abstained`` a search Concord abstains on returns no nodes."""

    def __init__(
        self,
        client: Concord | None = None,
        *,
        async_client: AsyncConcord | None = None,
        top_k: int = 4,
        search_options: dict[str, Any] | None = None,
        drop_abstained: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._client = client
        self._async_client = async_client
        self._top_k = top_k
        self._search_options = dict(search_options or {})
        self._drop_abstained = drop_abstained

    def _options(self) -> dict[str, Any]:
        return {**self._search_options, "top_k": self._top_k}

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        if self._client is None:
            self._client = Concord()
        return self._nodes(self._client.search(query_bundle.query_str, **self._options()))

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        if self._async_client is None:
            self._async_client = AsyncConcord()
        response = await self._async_client.search(query_bundle.query_str, **self._options())
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
