"""The ingest steps, each a function from values to new values (shared/ingest/values.py):
parse a claim, chunk what was parsed, embed a batch of chunked documents. They touch no
transaction and no job: the embed step reads and fills the embedding cache it is handed (a
port: Postgres in a worker, a dictionary in a unit test), and the pipeline
(shared/ingest/pipeline.py) runs them, charges a failure to its job and writes the result.
"""

from __future__ import annotations

import hashlib
import math
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from shared.errors import ParseError
from shared.ingest.chunking import ChunkContext, Chunker, contextual_text
from shared.ingest.embedding import Embedder
from shared.ingest.values import Chunked, Claim, Encoded, Parsed, Waiting
from shared.parsing import ParseOptions, parse
from shared.settings import Settings
from shared.stores.ports import CachedEmbeddings
from shared.timing import StageTimes


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def make_chunker(settings: Settings, embedder: Embedder) -> Chunker:
    return Chunker(
        embedder.token_offsets,
        settings.chunk_max_tokens,
        settings.chunk_overlap_tokens,
        settings.chunk_max_chars,
        settings.chunk_min_tokens,
    )


def parse_step(claim: Claim, options: ParseOptions) -> Parsed:
    """The claim's bytes read by the parser of their content type; the value carries the
    claim forward without them."""
    timings: dict[str, float] = {}
    with StageTimes(timings).stage("parse"):
        document = parse(claim.raw, claim.content_type, options)
    return Parsed(replace(claim, raw=b""), document, timings)


def chunk_step(parsed: Parsed, chunker: Chunker, max_chunks: int) -> Chunked:
    """The parsed document cut into chunks, each with a hash of its text. A document of more
    than ``max_chunks`` chunks is refused (its job fails, with what to do about it)."""
    timings = dict(parsed.timings)
    with StageTimes(timings).stage("chunk"):
        pieces = chunker.chunk(parsed.document)
        if len(pieces) > max_chunks:
            raise ParseError(
                f"the document makes {len(pieces)} chunks; the limit is {max_chunks} "
                "(CONCORD_MAX_CHUNKS_PER_DOCUMENT): split it into several documents"
            )
        hashes = tuple(text_hash(p.text) for p in pieces)
    return Chunked(parsed.claim, tuple(pieces), hashes, tuple(parsed.document.notes), timings)


# A document takes at most this many turns to encode: each turn parses and chunks it again,
# so a very large one encodes more than a turn's chunks at a time (8,000 chunks: 1,000 a turn).
MAX_TURNS = 8


@dataclass(frozen=True)
class EmbedTurn:
    """What a turn of the embed step made of its batch: for each document in order, its
    vectors (``Encoded``) or what it waits for (``Waiting``); and how many chunks it encoded."""

    results: list[Encoded | Waiting]
    encoded: int


def embed_step(
    batch: Sequence[Chunked],
    embedder: Embedder,
    cache: CachedEmbeddings,
    *,
    commit_every: int,
    context: ChunkContext = "none",
    titles: Mapping[uuid.UUID, str] | None = None,
    turn_chunks: int | None = None,
) -> EmbedTurn:
    """Encode every chunk of the batch that this model has never embedded (as what
    ``context`` makes of it: the chunk alone, or after its document's title, from ``titles``,
    and its section path); each document is charged its share of the time by chunk count. The
    vectors are cached by a hash of exactly what was encoded, ``commit_every`` chunks at a
    time, so that an attempt cut short (a time limit, a crash) leaves its work for the next
    one: a document of any size gets through in the end.

    At most ``turn_chunks`` chunks are encoded (documents in batch order); a document with
    chunks left after that is ``Waiting`` for its next turn."""
    started = time.perf_counter()
    # Before the cache's first transaction opens: the first call in a process may load the
    # model and export it to ONNX, which must not hold a transaction (and its locks) meanwhile.
    model_id = embedder.model_id
    encoded, keys = _what_to_encode(batch, context, titles or {})
    cached = cache.cached(model_id, [k for own in keys for k in own])
    wanted = {  # each key once, in batch order: its text and token count
        k: (text, piece.token_count)
        for c, own, made in zip(batch, keys, encoded, strict=True)
        for k, text, piece in zip(own, made, c.pieces, strict=True)
    }
    missing = [k for k in wanted if k not in cached]
    if turn_chunks is not None:
        all_chunks = sum(len(own) for own in keys)
        missing = missing[: max(turn_chunks, math.ceil(all_chunks / MAX_TURNS))]
    fresh = _encode(
        embedder,
        cache,
        [wanted[k][0] for k in missing],
        missing,
        # the chunker counted the chunks' tokens; with a context the encoder counts again
        [wanted[k][1] for k in missing] if context == "none" else None,
        commit_every,
    )
    results = _results(batch, keys, cached, fresh, time.perf_counter() - started)
    return EmbedTurn(results, len(missing))


def _results(
    batch: Sequence[Chunked],
    keys: list[list[str]],
    cached: dict[str, np.ndarray],
    fresh: dict[str, np.ndarray],
    elapsed: float,
) -> list[Encoded | Waiting]:
    """Each document with all its vectors ``Encoded`` (charged its share of ``elapsed`` by
    chunk count), the others ``Waiting``."""
    vectors = cached | fresh
    all_chunks = max(sum(len(own) for own in keys), 1)
    results: list[Encoded | Waiting] = []
    for chunked, own in zip(batch, keys, strict=True):
        left = sum(1 for k in own if k not in vectors)
        if left:
            results.append(Waiting(chunked, left))
            continue
        results.append(
            Encoded(
                chunked,
                tuple(vectors[k] for k in own),
                cache_hits=sum(1 for k in own if k in cached),
                timings={**chunked.timings, "embed": round(elapsed * len(own) / all_chunks, 4)},
            )
        )
    return results


def _encode(
    embedder: Embedder,
    cache: CachedEmbeddings,
    texts: list[str],
    keys: list[str],
    token_counts: list[int] | None,
    commit_every: int,
) -> dict[str, np.ndarray]:
    """``texts`` encoded and cached under ``keys``, ``commit_every`` at a time."""
    fresh: dict[str, np.ndarray] = {}
    for start in range(0, len(keys), commit_every):
        part = slice(start, start + commit_every)
        vectors = embedder.embed_passages(
            texts[part], token_counts=token_counts[part] if token_counts else None
        )
        made = dict(zip(keys[part], vectors, strict=True))
        cache.keep(embedder.model_id, made)
        fresh.update(made)
    return fresh


def _what_to_encode(
    batch: Sequence[Chunked], context: ChunkContext, titles: Mapping[uuid.UUID, str]
) -> tuple[list[list[str]], list[list[str]]]:
    """Per document, the text each chunk is encoded as (alone, or after its document's title
    and section path) and the key its vector is cached under: a hash of exactly that text
    (the chunk's own hash where that is its text)."""
    encoded = [
        [
            contextual_text(
                p.text, titles.get(c.claim.document_id, ""), p.section, context, p.flags
            )
            for p in c.pieces
        ]
        for c in batch
    ]
    keys = [
        [
            known if text == p.text else text_hash(text)
            for known, text, p in zip(c.hashes, made, c.pieces, strict=True)
        ]
        for c, made in zip(batch, encoded, strict=True)
    ]
    return encoded, keys
