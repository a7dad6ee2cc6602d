"""The ingest steps as values (shared/ingest/steps.py): parse, chunk and embed run with no
service, the embed step on the in-memory embedding cache (the Postgres one passes the same
contract: tests/contract/test_ports.py). The pipeline that runs them over claimed jobs and
writes the result is proven on the real stores (tests/integration/ingest/test_pipeline.py)."""

from __future__ import annotations

import dataclasses
import hashlib
import re
import uuid
from typing import Any

import numpy as np
import pytest

from shared.errors import ParseError
from shared.ingest.steps import MAX_TURNS, chunk_step, embed_step, make_chunker, parse_step
from shared.ingest.values import Chunked, Claim, Encoded, Waiting
from shared.parsing import options_from
from shared.settings import get_settings
from shared.stores.memory import MemoryCachedEmbeddings

SENTENCES = " ".join(f"Tide table entry {i} lists the harbour's high water." for i in range(60))


class CountingEncoder:
    """A stand-in for the embedder: a token per word or mark, a vector seeded by each text,
    and a count of the texts it was asked to encode."""

    model_id = "stand-in"

    def __init__(self) -> None:
        self.encoded: list[str] = []

    def token_offsets(self, text: str) -> list[tuple[int, int]]:
        return [(m.start(), m.end()) for m in re.finditer(r"\w+|[^\w\s]", text)]

    def embed_passages(self, texts: list[str], token_counts: Any = None) -> np.ndarray:
        self.encoded += texts
        seeds = [int(hashlib.sha256(t.encode()).hexdigest()[:8], 16) for t in texts]
        return np.stack([np.random.default_rng(s).standard_normal(8) for s in seeds])


@pytest.fixture
def encoder() -> CountingEncoder:
    return CountingEncoder()


def _claim(text: str) -> Claim:
    return Claim(uuid.uuid4(), "acme", uuid.uuid4(), 1, text.encode(), "text/plain")


def _chunked(text: str, encoder: CountingEncoder, max_chunks: int = 1000) -> Chunked:
    settings = get_settings().model_copy(
        update={"chunk_max_tokens": 40, "chunk_overlap_tokens": 8, "chunk_min_tokens": 0}
    )
    chunker = make_chunker(settings, encoder)  # type: ignore[arg-type]
    return chunk_step(parse_step(_claim(text), options_from(settings)), chunker, max_chunks)


def _embed(batch: list[Chunked], encoder: CountingEncoder, cache: Any, **options: Any) -> Any:
    return embed_step(batch, encoder, cache, commit_every=4, **options)  # type: ignore[arg-type]


def test_each_step_returns_a_new_value_and_leaves_what_it_was_given() -> None:
    claim = _claim(SENTENCES)
    before = dataclasses.astuple(claim)
    parsed = parse_step(claim, options_from(get_settings()))
    assert dataclasses.astuple(claim) == before  # the claim still holds its bytes
    assert parsed.claim.raw == b"" and parsed.claim.job_id == claim.job_id  # let go of
    assert parsed.document.text.startswith("Tide table entry 0") and set(parsed.timings) == {
        "parse"
    }
    chunked = chunk_step(parsed, make_chunker(get_settings(), CountingEncoder()), 1000)  # type: ignore[arg-type]
    assert set(parsed.timings) == {"parse"} and set(chunked.timings) == {"parse", "chunk"}
    assert len(chunked.pieces) == len(chunked.hashes) >= 1
    assert chunked.hashes[0] == hashlib.sha256(chunked.pieces[0].text.encode()).hexdigest()
    with pytest.raises(dataclasses.FrozenInstanceError):
        chunked.pieces = ()  # type: ignore[misc]


def test_a_document_over_the_chunk_limit_is_refused_with_what_to_do(
    encoder: CountingEncoder,
) -> None:
    with pytest.raises(ParseError, match="CONCORD_MAX_CHUNKS_PER_DOCUMENT"):
        _chunked(SENTENCES, encoder, max_chunks=2)


def test_text_encoded_once_is_read_from_the_cache_after(encoder: CountingEncoder) -> None:
    cache = MemoryCachedEmbeddings()
    chunked = _chunked(SENTENCES, encoder)
    first = _embed([chunked], encoder, cache)
    assert first.encoded == len(chunked.pieces) == len(encoder.encoded)
    (encoded,) = first.results
    assert isinstance(encoded, Encoded) and encoded.cache_hits == 0
    assert "embed" in encoded.timings and "embed" not in chunked.timings

    again = _embed([chunked], encoder, cache)
    (cached,) = again.results
    assert again.encoded == 0 and len(encoder.encoded) == len(chunked.pieces)  # none again
    assert isinstance(cached, Encoded) and cached.cache_hits == len(chunked.pieces)
    for kept, made in zip(cached.vectors, encoded.vectors, strict=True):
        np.testing.assert_array_equal(kept, made)


def test_a_turn_encodes_its_chunks_and_a_document_with_more_waits_for_the_next(
    encoder: CountingEncoder,
) -> None:
    cache = MemoryCachedEmbeddings()
    small, large = _chunked("Slack water.", encoder), _chunked(SENTENCES, encoder)
    turn = len(small.pieces) + 2
    assert len(large.pieces) > 2 * turn  # several turns' worth

    first = _embed([small, large], encoder, cache, turn_chunks=turn)
    assert first.encoded == turn
    done, waiting = first.results
    assert isinstance(done, Encoded) and done.claim == small.claim
    assert isinstance(waiting, Waiting) and waiting.left_to_encode == len(large.pieces) - 2

    turns, result = 1, waiting
    while isinstance(result, Waiting):
        turns += 1
        later = _embed([large], encoder, cache, turn_chunks=turn)
        assert 0 < later.encoded <= max(turn, -(-len(large.pieces) // MAX_TURNS))
        (result,) = later.results
    assert turns >= 3 and len(encoder.encoded) == len(small.pieces) + len(large.pieces)
    assert result.cache_hits == len(large.pieces) - later.encoded  # each chunk encoded once


def test_a_chunk_encoded_after_its_title_is_cached_apart_from_the_bare_chunk(
    encoder: CountingEncoder,
) -> None:
    cache = MemoryCachedEmbeddings()
    chunked = _chunked("Slack water lasts minutes.", encoder)
    _embed([chunked], encoder, cache)
    titled = _embed(
        [chunked], encoder, cache, context="title", titles={chunked.claim.document_id: "Tides"}
    )
    (encoded,) = titled.results
    assert isinstance(encoded, Encoded) and encoded.cache_hits == 0
    assert encoder.encoded[-1].startswith("Tides") and titled.encoded == len(chunked.pieces)
