"""Unit tests of vector storage and embedding batches (shared/vector_type.py,
shared/ingest/embedding.py): no services."""

from __future__ import annotations

import itertools

import pytest


def test_pgvector_binary_form_reads_back_as_float32() -> None:
    import numpy as np

    from shared.vector_type import vector_from_bytes

    values = np.array([0.5, -1.25, 3.0e-8], dtype=">f4")
    raw = (3).to_bytes(2, "big") + (0).to_bytes(2, "big") + values.tobytes()
    vector = vector_from_bytes(raw)
    assert vector.dtype == np.float32
    assert vector.tolist() == values.astype(np.float32).tolist()


def test_numpy_vectors_are_written_in_pgvector_binary_form_and_lists_as_text() -> None:
    import numpy as np

    from shared.vector_type import EmbeddingVector, PackedVector, vector_from_bytes

    to_db = EmbeddingVector(3).bind_processor(None)  # type: ignore[arg-type]
    packed = to_db(np.array([0.5, -1.25, 3.0e-8], dtype=np.float32))
    assert isinstance(packed, PackedVector)
    expected = np.array([0.5, -1.25, 3.0e-8], dtype=np.float32)
    assert vector_from_bytes(packed.data).tolist() == expected.tolist()
    assert to_db([0.5, 2.0]) == "[0.5,2.0]"
    with pytest.raises(ValueError, match="one dimension"):
        to_db(np.zeros((2, 3), dtype=np.float32))


def test_length_batches_cover_every_text_once_within_the_size_limit_and_pad_less() -> None:
    import random

    from shared.ingest.embedding import length_batches

    rng = random.Random(7)
    lengths = [rng.choice([rng.randint(5, 120), rng.randint(180, 202)]) for _ in range(75)]
    batches = length_batches(lengths, max_batch=32, batch_cost=200)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    assert all(0 < len(batch) <= 32 for batch in batches)

    def padded(runs: list[list[int]]) -> int:
        return sum(max(lengths[i] for i in run) * len(run) for run in runs)

    # sentence-transformers' own batching: length-sorted runs of exactly 32
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    fixed = [order[i : i + 32] for i in range(0, len(order), 32)]
    assert padded(batches) + 200 * len(batches) <= padded(fixed) + 200 * len(fixed)
    assert padded(batches) < padded(fixed)
    assert length_batches([], 32, 200) == []
    assert length_batches([10] * 5, 32, 200) == [[0, 1, 2, 3, 4]]  # equal lengths: one call


def test_passages_come_back_in_the_order_given_whatever_the_batching() -> None:
    import numpy as np

    from shared.ingest.embedding import Embedder, get_embedder

    # fp32 torch, so that the order is compared with vectors equal to the model's own
    embedder = Embedder(get_embedder().settings.model_copy(update={"passage_encoder": "torch"}))
    texts = ["short one", "a much longer passage about harbours " * 20, "mid length text " * 5]
    texts = texts * 3 + ["x"]
    vectors = embedder.embed_passages(texts)
    one_by_one = embedder.model().encode(texts, batch_size=1, normalize_embeddings=True)
    assert vectors.shape == (len(texts), embedder.settings.embedding_dim)
    assert np.min(np.sum(vectors * one_by_one, axis=1)) > 0.99999
    assert embedder.embed_passages([]).shape == (0, embedder.settings.embedding_dim)


def test_passage_encoders_match_fp32_torch_and_the_inexact_ones_are_cached_apart(
    tmp_path,
) -> None:
    """Passages of mixed lengths through each encoder: ONNX fp32 gives torch's vectors; bf16
    and int8 give vectors close to them, under cache keys of their own; the ONNX encoders'
    vectors do not depend on the other texts of the call; ``auto`` is bf16 where the CPU has
    it natively, and the default is onnx-int8."""
    import numpy as np

    from shared.ingest.embedding import Embedder, cpu_has_native_bf16, get_embedder
    from shared.settings import Settings

    texts = ["short one", "a much longer passage about harbours " * 30, "mid length text " * 5]
    texts = texts * 4 + ["x"]
    reference = get_embedder().model().encode(texts, normalize_embeddings=True, batch_size=1)
    settings = get_embedder().settings.model_copy(update={"onnx_export_dir": str(tmp_path)})

    def embedder(encoder: str) -> Embedder:
        return Embedder(settings.model_copy(update={"passage_encoder": encoder}))

    torch_fp32, onnx_fp32, int8, bf16 = (
        embedder(e) for e in ("torch", "onnx", "onnx-int8", "torch-bf16")
    )
    assert onnx_fp32.passage_encoder() is not None and int8.passage_encoder() is not None
    assert torch_fp32.passage_encoder() is None and bf16.passage_encoder() is None
    for exact in (torch_fp32, onnx_fp32):
        assert np.min(np.sum(exact.embed_passages(texts) * reference, axis=1)) > 0.99999
    for close, floor in ((int8, 0.98), (bf16, 0.999)):
        vectors = close.embed_passages(texts)
        assert floor < np.min(np.sum(vectors * reference, axis=1)) < 0.999999  # close, not equal
        assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    # A passage's vector is a function of its own text, whatever shares the worker's batch
    # (another tenant's texts among them): int8 quantizes activations with one scale per
    # call, and in one call with the long text the short ones' vectors moved (cosine 0.987).
    for per_text in (onnx_fp32, int8):
        alone = np.stack([per_text.embed_passages([text])[0] for text in texts])
        assert np.allclose(per_text.embed_passages(texts), alone, rtol=0, atol=1e-6)
    ids = {e.model_id for e in (torch_fp32, onnx_fp32, int8, bf16)}
    assert torch_fp32.model_id == onnx_fp32.model_id and len(ids) == 3
    # Where the export cannot be written (or the model not exported as is), int8 falls back
    # to fp32 torch, and its vectors are cached as fp32 torch's, not under int8's key.
    (tmp_path / "not-a-directory").write_text("")
    unexportable = Embedder(
        settings.model_copy(
            update={
                "passage_encoder": "onnx-int8",
                "onnx_export_dir": str(tmp_path / "not-a-directory"),
            }
        )
    )
    assert unexportable.passage_encoder() is None
    assert unexportable.model_id == torch_fp32.model_id
    assert np.min(np.sum(unexportable.embed_passages(texts) * reference, axis=1)) > 0.99999
    auto = embedder("auto")
    assert auto.passage_encoding == ("torch-bf16" if cpu_has_native_bf16() else "torch")
    assert Settings.model_fields["passage_encoder"].default == "onnx-int8"


def test_an_export_is_written_by_one_process_while_the_others_wait(tmp_path) -> None:
    """Four writers of one export at once (processes starting together, each its own open
    file, as threads here): one writes it, the others wait and find it written; none sees it
    half made. (ONNX Runtime's quantizer, run twice at once, deleted its own scratch file
    under the other and sent that process to torch for its life.)"""
    import threading
    import time

    from shared.ingest.onnx_encoder import made_once

    path = tmp_path / "exports" / "model-int8.onnx"
    writes: list[int] = []
    seen: list[bytes] = []

    def write() -> None:
        writes.append(threading.get_ident())
        time.sleep(0.2)  # long enough for every other thread to arrive meanwhile
        path.write_bytes(b"whole")

    def start() -> None:
        made_once(path, write)
        seen.append(path.read_bytes())

    threads = [threading.Thread(target=start) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(writes) == 1 and seen == [b"whole"] * 4


def test_tokenizer_prefix_counts_equal_counting_each_prefix() -> None:
    from shared.ingest.chunking import sentence_spans
    from shared.search.decide import TokenizerCounter

    text = (
        "Vitamin D deficiency (VDD) affects 1,234 patients. Was it caused by e.g. diet? "
        "Résumé: IL-6 rose 2.5-fold in CD4+ cells; see Fig. 3. Done."
    )
    counter = TokenizerCounter()
    ends = [end for _, end in sentence_spans(text, 0, len(text))]
    assert len(ends) >= 3
    assert counter.prefix_counts(text, ends) == [counter(text[:end]) for end in ends]


def test_token_counts_are_the_embedders_tokenizer_counts_of_any_length() -> None:
    """The policy counts with its own copy of the tokenizer: the same counts as the model's
    tokenizer, and no truncation at the model's maximum length."""
    from shared.ingest.embedding import get_embedder
    from shared.search.decide import TokenizerCounter

    tokenizer = get_embedder().model().tokenizer
    counter = TokenizerCounter()
    texts = ["", "Résumé: IL-6 rose 2.5-fold in CD4+ cells; see Fig. 3.", "\u200b\U0001f600 é"]
    texts.append(" ".join(["tokenization of a long text"] * 400))  # past 512 tokens
    for text in texts:
        assert counter(text) == len(tokenizer.encode(text, add_special_tokens=False))
    assert counter(texts[-1]) > 1000


def test_a_long_text_is_tokenized_a_window_at_a_time_into_the_same_tokens() -> None:
    """Chunking tokenizes a whole document; in windows cut after whitespace (so the worker's
    lease heartbeat gets the GIL between them) the offsets are those of one call."""
    from shared.ingest.embedding import get_embedder, tokenizing_windows

    embedder = get_embedder()
    sentence = "Résumé: IL-6 rose 2.5-fold in CD4+ cells; see Fig. 3 \u65b0\u3057\u3044!\n"
    text = sentence * 5000 + "x" * 120_000 + " tail"  # and one "word" past a window
    windows = tokenizing_windows(text)
    assert len(windows) > 3 and windows[0][0] == 0 and windows[-1][1] == len(text)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(windows))
    assert all(end - start <= 100_000 for start, end in windows)
    embedder.token_offsets("")  # loads the counting tokenizer
    one_call = embedder._counting_tokenizer
    assert one_call is not None
    expected = one_call.encode(sentence * 5000, add_special_tokens=False)
    assert embedder.token_offsets(sentence * 5000) == expected.offsets
    assert len(embedder.token_offsets(text)) >= len(expected.offsets) + 2
