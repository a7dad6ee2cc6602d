"""The Haystack peer: what a user would build instead of Concord, on the same stores and model.

Haystack 3.x with ``elasticsearch-haystack`` (BM25) and ``pgvector-haystack`` (HNSW cosine),
the same sentence-transformers model as Concord, the two retrievers joined by reciprocal rank
fusion. ``concord eval --peer haystack`` runs this script in the peer's own virtual environment
(``bench/peers/haystack/setup.sh``) and scores its rankings with Concord's metric code.

Output (``--out``): ``{"system", "index_seconds", "configs": {name: {"rankings": {qid:
[doc ids]}, "latencies_ms": [...]}}}``. Latency is one ``Pipeline.run`` per query, in process
(Concord's is measured over HTTP, so the comparison favours the peer).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

from elasticsearch import Elasticsearch
from haystack import Document, Pipeline
from haystack.components.joiners import DocumentJoiner
from haystack.utils import Secret
from haystack_integrations.components.embedders.sentence_transformers import (
    SentenceTransformersDocumentEmbedder,
    SentenceTransformersTextEmbedder,
)
from haystack_integrations.components.retrievers.elasticsearch import ElasticsearchBM25Retriever
from haystack_integrations.components.retrievers.pgvector import PgvectorEmbeddingRetriever
from haystack_integrations.document_stores.elasticsearch import ElasticsearchDocumentStore
from haystack_integrations.document_stores.pgvector import PgvectorDocumentStore


def _info_from_cluster_health(self: Elasticsearch, **_: Any) -> Any:
    """The integ-test Elasticsearch zip lacks the rest-root module, so ``GET /`` answers 405.
    The document store calls ``info()`` only to check the connection; cluster health checks
    the same thing."""
    return self.cluster.health()


Elasticsearch.info = _info_from_cluster_health  # type: ignore[method-assign]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def index_corpus(
    corpus: list[dict[str, Any]],
    es_store: ElasticsearchDocumentStore,
    pg_store: PgvectorDocumentStore,
    model: str,
) -> float:
    """Write the corpus to both stores unless they already hold it; returns seconds spent."""
    if es_store.count_documents() == len(corpus) and pg_store.count_documents() == len(corpus):
        return 0.0
    started = time.perf_counter()
    docs = [
        Document(id=str(r["_id"]), content=r.get("text", ""), meta={"title": r.get("title", "")})
        for r in corpus
    ]
    embedder = SentenceTransformersDocumentEmbedder(
        model=model,
        meta_fields_to_embed=["title"],
        normalize_embeddings=True,
        local_files_only=True,
    )
    embedder.warm_up()
    embedded = embedder.run(documents=docs)["documents"]
    es_store.write_documents(docs, policy="overwrite")
    pg_store.write_documents(embedded, policy="overwrite")
    return time.perf_counter() - started


def pipelines(
    es_store: ElasticsearchDocumentStore, pg_store: PgvectorDocumentStore, model: str, top_k: int
) -> dict[str, tuple[Pipeline, Any]]:
    def text_embedder() -> SentenceTransformersTextEmbedder:
        return SentenceTransformersTextEmbedder(
            model=model, normalize_embeddings=True, local_files_only=True
        )

    lexical = Pipeline()
    lexical.add_component("bm25", ElasticsearchBM25Retriever(document_store=es_store, top_k=top_k))

    dense = Pipeline()
    dense.add_component("embed", text_embedder())
    dense.add_component("vector", PgvectorEmbeddingRetriever(document_store=pg_store, top_k=top_k))
    dense.connect("embed.embedding", "vector.query_embedding")

    hybrid = Pipeline()
    hybrid.add_component("embed", text_embedder())
    hybrid.add_component("vector", PgvectorEmbeddingRetriever(document_store=pg_store, top_k=top_k))
    hybrid.add_component("bm25", ElasticsearchBM25Retriever(document_store=es_store, top_k=top_k))
    hybrid.add_component("join", DocumentJoiner(join_mode="reciprocal_rank_fusion", top_k=top_k))
    hybrid.connect("embed.embedding", "vector.query_embedding")
    hybrid.connect("vector", "join")
    hybrid.connect("bm25", "join")

    return {
        "lexical": (lexical, lambda q: {"bm25": {"query": q}}),
        "dense": (dense, lambda q: {"embed": {"text": q}}),
        "hybrid_rrf": (hybrid, lambda q: {"embed": {"text": q}, "bm25": {"query": q}}),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--queries", type=Path, required=True, help="JSON list of [qid, text]")
    parser.add_argument("--model", required=True, help="sentence-transformers model path")
    parser.add_argument("--es-url", required=True)
    parser.add_argument("--pg-dsn", required=True, help="postgresql://user:password@host:port/db")
    parser.add_argument("--name", default="haystack", help="index and table name stem")
    parser.add_argument("--top-k", type=int, default=100)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    corpus = read_jsonl(args.dataset / "corpus.jsonl")
    queries: list[tuple[str, str]] = [tuple(q) for q in json.loads(args.queries.read_text())]
    es_store = ElasticsearchDocumentStore(hosts=args.es_url, index=f"{args.name}-peer")
    pg_store = PgvectorDocumentStore(
        connection_string=Secret.from_token(args.pg_dsn),
        table_name=f"{args.name.replace('-', '_')}_peer",
        embedding_dimension=384,
        vector_function="cosine_similarity",
        search_strategy="hnsw",
    )
    print(f"peer: indexing {len(corpus)} documents (skipped when already there)", flush=True)
    index_seconds = index_corpus(corpus, es_store, pg_store, args.model)
    es_store.client.indices.refresh(index=f"{args.name}-peer")

    out: dict[str, Any] = {
        "system": (
            f"haystack-ai {version('haystack-ai')}, elasticsearch-haystack "
            f"{version('elasticsearch-haystack')}, pgvector-haystack {version('pgvector-haystack')}"
        ),
        "index_seconds": round(index_seconds, 1),
        "configs": {},
    }
    for name, (pipeline, inputs) in pipelines(es_store, pg_store, args.model, args.top_k).items():
        pipeline.warm_up()
        pipeline.run(inputs("warm up"))
        rankings: dict[str, list[str]] = {}
        latencies: list[float] = []
        for i, (qid, text) in enumerate(queries, start=1):
            started = time.perf_counter()
            result = pipeline.run(inputs(text))
            latencies.append((time.perf_counter() - started) * 1e3)
            docs = next(iter(result.values()))["documents"]
            rankings[qid] = [d.id for d in docs]
            if i % 50 == 0 or i == len(queries):
                print(f"peer {name}: {i}/{len(queries)} queries", flush=True)
        out["configs"][name] = {"rankings": rankings, "latencies_ms": latencies}
    args.out.write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
