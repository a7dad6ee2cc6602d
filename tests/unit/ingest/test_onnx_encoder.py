"""The encoders through ONNX Runtime (shared/ingest/onnx_encoder.py), and the fallback to torch."""

from __future__ import annotations

import pytest


def test_onnx_query_encoder_matches_the_sentence_transformers_model(tmp_path) -> None:
    import numpy as np

    from shared.ingest.embedding import get_embedder
    from shared.ingest.onnx_encoder import OnnxEncoder

    model = get_embedder().model()
    encoder = OnnxEncoder(model, tmp_path)  # exports into tmp_path on first use
    assert (tmp_path / "model.onnx").exists()
    queries = ["vitamin D and bone density", "IL-6 in CD4+ T cells", "a" * 3000]
    torch_vectors = model.encode(queries, normalize_embeddings=True, convert_to_numpy=True)
    for query, expected in zip(queries, torch_vectors, strict=True):
        vector = encoder.encode(query)  # the long one is truncated like the model truncates
        assert vector.shape == expected.shape
        assert float(np.linalg.norm(vector)) == pytest.approx(1.0, abs=1e-5)
        assert float(vector @ expected) > 0.99999
    # A second encoder reuses the export instead of writing it again.
    mtime = (tmp_path / "model.onnx").stat().st_mtime_ns
    OnnxEncoder(model, tmp_path)
    assert (tmp_path / "model.onnx").stat().st_mtime_ns == mtime


def test_the_onnx_encoders_tokenizer_gives_the_wrappers_ids_masks_and_types() -> None:
    """The encoders call the fast tokenizer directly (half the time a text); what they feed
    the model must be what the transformers wrapper gives, truncation included."""
    from shared.ingest.embedding import get_embedder
    from shared.ingest.onnx_encoder import direct_tokenizer

    model = get_embedder().model()
    direct = direct_tokenizer(model, model.max_seq_length)
    texts = [
        "",
        "a",
        "IL-6 in CD4+ T cells: the patient\u2019s 3.5-fold rise (p<0.01)",
        "Das Gehirn \u00e9t\u00e9 \u65b0\u3057\u3044 \U0001f600  tabs\tand\nnewlines",
        "word " * 400,  # past the model's 256 tokens
    ]
    for text in texts:
        wrapped = model.tokenizer([text], truncation=True, max_length=model.max_seq_length)
        tokens = direct.encode(text)
        assert tokens.ids == wrapped["input_ids"][0]
        assert tokens.attention_mask == wrapped["attention_mask"][0]
        assert tokens.type_ids == wrapped["token_type_ids"][0]
    assert len(direct.encode(texts[-1]).ids) == model.max_seq_length


def test_query_encoder_falls_back_to_torch_when_onnx_cannot_be_set_up(tmp_path) -> None:
    import numpy as np

    from shared.ingest.embedding import Embedder
    from shared.settings import Settings

    blocked = tmp_path / "onnx"
    blocked.write_text("a file where the export directory should go")
    embedder = Embedder(Settings(onnx_export_dir=str(blocked)))
    assert embedder.query_encoder() is None  # the export could not be written
    vector = embedder.embed_query("vitamin D and bone density")
    torch_only = Embedder(Settings(onnx_export_dir=str(blocked), query_encoder="torch"))
    assert float(vector @ torch_only.embed_query("vitamin D and bone density")) > 0.99999
    assert np.isclose(np.linalg.norm(vector), 1.0, atol=1e-5)


def test_queries_through_torch_are_fp32_whatever_encodes_passages() -> None:
    """CONCORD_QUERY_ENCODER=torch with the default int8 passages: queries are the model's
    own fp32 vectors, not int8 ones."""
    from shared.ingest.embedding import Embedder
    from shared.settings import Settings

    embedder = Embedder(Settings(query_encoder="torch"))
    assert embedder.passage_encoder() is not None  # int8 passages are set up
    query = "vitamin D and bone density"
    expected = embedder.model().encode([query], normalize_embeddings=True)[0]
    assert float(embedder.embed_query(query) @ expected) > 0.99999
