"""Pure unit tests: chunking, parsing, fusion (no services)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from shared.errors import ParseError, UnsupportedMediaType
from shared.ingest.chunking import Chunker
from shared.ingest.parsing import parse, resolve_content_type
from shared.search.fusion import ArmHit, rrf


def word_offsets(text: str) -> list[tuple[int, int]]:
    """A stand-in tokenizer: one token per word or punctuation mark."""
    return [(m.start(), m.end()) for m in re.finditer(r"\w+|[^\w\s]", text)]


def test_chunks_respect_token_budget_offsets_and_sections():
    md = "# Intro\nCats purr. Dogs bark loudly.\n\n## Care\n" + "Feed them daily. " * 40
    chunker = Chunker(word_offsets, max_tokens=30, overlap_tokens=6)
    doc = parse(md.encode(), "text/markdown")
    chunks = chunker.chunk(doc)
    assert len(chunks) > 3
    for chunk in chunks:
        assert chunk.token_count <= 30
        assert doc.text[chunk.char_start : chunk.char_end] == chunk.text
    assert chunks[0].section == "Intro"
    assert chunks[-1].section == "Intro > Care"
    # Overlap: consecutive chunks in one section share text.
    assert chunks[2].char_start < chunks[1].char_end


def test_overlong_sentence_is_cut_at_token_boundaries():
    text = "word " * 100
    chunks = Chunker(word_offsets, max_tokens=16, overlap_tokens=0).chunk(
        parse(text.encode(), "text/plain")
    )
    assert all(c.token_count <= 16 for c in chunks)
    assert sum(c.token_count for c in chunks) == 100


def test_html_boilerplate_is_stripped_and_headings_kept():
    html = b"""<html><head><script>var x = 1;</script><style>p{}</style></head><body>
    <nav>Home | About</nav><h1>Guide</h1><p>Install the pump.</p><h2>Safety</h2>
    <p>Wear gloves.</p><footer>(c) 2026</footer></body></html>"""
    doc = parse(html, "text/html")
    assert "var x" not in doc.text and "Home | About" not in doc.text and "(c)" not in doc.text
    assert "Install the pump." in doc.text
    assert doc.section_at(doc.text.index("Wear gloves")) == "Guide > Safety"


@pytest.mark.parametrize(
    ("raw", "content_type", "reason"),
    [
        (b"", "text/plain", "empty"),
        (b"\xff\xfe\x00bad", "text/plain", "UTF-8"),
        (b"%PDF-1.4 garbage", "application/pdf", "PDF"),
        (b"<html><body><script>x</script></body></html>", "text/html", "no text"),
        (b'{"a": ', "application/json", "invalid JSON"),
    ],
)
def test_unparseable_documents_give_a_reason(raw, content_type, reason):
    with pytest.raises(ParseError, match=reason):
        parse(raw, content_type)


def test_content_type_from_magic_bytes_then_header_then_extension():
    assert resolve_content_type("text/plain", "x.txt", b"%PDF-1.7") == "application/pdf"
    assert resolve_content_type("application/octet-stream", "a.md", b"# hi") == "text/markdown"
    with pytest.raises(UnsupportedMediaType):
        resolve_content_type("image/png", "a.png", b"\x89PNG")


def test_json_records_use_configured_text_fields():
    raw = b'{"title": "T1", "text": "alpha"}\n{"title": "T2", "body": "beta"}\n'
    doc = parse(raw, "application/x-ndjson")
    assert doc.text == "alpha\n\nbeta"
    assert doc.section_at(doc.text.index("beta")) == "T2"


def test_rrf_rewards_agreement_and_respects_weights():
    dense = [ArmHit("a", 1, 0.9), ArmHit("b", 2, 0.8)]
    lexical = [ArmHit("b", 1, 12.0), ArmHit("c", 2, 9.0)]
    fused = rrf({"dense": dense, "lexical": lexical}, k=60)
    assert fused[0][0] == "b"
    assert fused[0][1] == pytest.approx(1 / 62 + 1 / 61)
    weighted = rrf(
        {"dense": dense, "lexical": lexical}, k=60, weights={"dense": 0.0, "lexical": 1.0}
    )
    assert [cid for cid, _ in weighted][:2] == ["b", "c"]


def test_blend_scores_mix_min_max_normalized_rerank_and_fused_scores() -> None:
    from shared.search.service import blend_scores

    rerank, fused = [3.0, 1.0, 2.0], [0.1, 0.3, 0.2]
    assert blend_scores(rerank, fused, 1.0) == rerank  # the reranker alone, raw
    assert blend_scores(rerank, fused, 0.0) == pytest.approx([0.0, 1.0, 0.5])
    assert blend_scores(rerank, fused, 0.25) == pytest.approx([0.25, 0.75, 0.5])
    assert blend_scores([], [], 0.3) == []


def test_settings_refuse_placeholder_secrets_outside_development() -> None:
    from pydantic import ValidationError

    from shared.settings import PLACEHOLDER_SECRETS, Settings

    for placeholder in PLACEHOLDER_SECRETS:
        with pytest.raises(ValidationError, match="CONCORD_PG_PASSWORD"):
            Settings(environment="production", pg_password=placeholder)
    assert Settings(environment="production", pg_password="s3cret-from-vault").pg_password
    assert Settings(environment="development").pg_password in PLACEHOLDER_SECRETS


def test_whole_sentence_prefix_is_the_longest_that_fits() -> None:
    from shared.search.policy import _whole_sentences_within

    text = "One two three. Four five. Six seven eight nine. Ten."

    class Words:
        def __call__(self, text: str) -> int:
            return len(text.split())

        def prefix_counts(self, text: str, ends: list[int]) -> list[int]:
            return [len(text[:end].split()) for end in ends]

    assert _whole_sentences_within(text, 0, Words()) == ("", 0)
    assert _whole_sentences_within(text, 2, Words()) == ("", 0)
    assert _whole_sentences_within(text, 3, Words()) == ("One two three.", 3)
    assert _whole_sentences_within(text, 8, Words()) == ("One two three. Four five.", 5)
    nine = "One two three. Four five. Six seven eight nine."
    assert _whole_sentences_within(text, 9, Words()) == (nine, 9)
    assert _whole_sentences_within(text, 100, Words()) == (text, 10)


def test_tokenizer_prefix_counts_equal_counting_each_prefix() -> None:
    from shared.ingest.chunking import sentence_spans
    from shared.search.service import _TokenizerCounter

    text = (
        "Vitamin D deficiency (VDD) affects 1,234 patients. Was it caused by e.g. diet? "
        "Résumé: IL-6 rose 2.5-fold in CD4+ cells; see Fig. 3. Done."
    )
    counter = _TokenizerCounter()
    ends = [end for _, end in sentence_spans(text, 0, len(text))]
    assert len(ends) >= 3
    assert counter.prefix_counts(text, ends) == [counter(text[:end]) for end in ends]


def test_onnx_query_encoder_matches_the_sentence_transformers_model(tmp_path) -> None:
    import numpy as np

    from shared.ingest.embedding import get_embedder
    from shared.search.query_encoder import OnnxQueryEncoder

    model = get_embedder().model()
    encoder = OnnxQueryEncoder(model, tmp_path)  # exports into tmp_path on first use
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
    OnnxQueryEncoder(model, tmp_path)
    assert (tmp_path / "model.onnx").stat().st_mtime_ns == mtime


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


def test_likely_results_keep_the_per_document_cap_by_chunk_id() -> None:
    from shared.ingest.pipeline import document_of_chunk
    from shared.search.service import _within_cap

    def _first_within_cap(ids: list[str], cap: int | None, count: int) -> list[str]:
        return _within_cap(ids, cap, document_of_chunk)[:count]

    ids = ["a:0", "a:1", "b:0", "a:2", "c:0", "b:1"]
    assert _first_within_cap(ids, None, 4) == ["a:0", "a:1", "b:0", "a:2"]
    assert _first_within_cap(ids, 1, 10) == ["a:0", "b:0", "c:0"]
    assert _first_within_cap(ids, 2, 4) == ["a:0", "a:1", "b:0", "c:0"]


def test_query_encoder_falls_back_to_torch_when_onnx_cannot_be_set_up(tmp_path) -> None:
    import numpy as np

    from shared.ingest.embedding import Embedder
    from shared.settings import Settings

    blocked = tmp_path / "state"
    blocked.write_text("a file where the export directory should go")
    embedder = Embedder(Settings(state_dir=blocked))
    assert embedder.query_encoder() is None  # the export could not be written
    vector = embedder.embed_query("vitamin D and bone density")
    torch_only = Embedder(Settings(state_dir=blocked, query_encoder="torch"))
    assert float(vector @ torch_only.embed_query("vitamin D and bone density")) > 0.99999
    assert np.isclose(np.linalg.norm(vector), 1.0, atol=1e-5)


def test_stack_errors_print_square_brackets_as_text(monkeypatch) -> None:
    """Elasticsearch's log lines name paths in square brackets, which rich would otherwise
    read as closing markup tags and fail on while reporting the real error."""
    from typer.testing import CliRunner

    from services.cli import stack, stack_commands

    message = "Elasticsearch did not become healthy\nsetting file [/x/operator/settings.json]"

    def refuse(settings: object) -> None:
        raise stack.StackError(message)

    monkeypatch.setattr(stack, "prepare_state_dir", refuse)
    result = CliRunner().invoke(stack_commands.app, ["up", "--infra-only"])
    assert result.exit_code == 1
    assert "[/x/operator/settings.json]" in result.output
    assert isinstance(result.exception, SystemExit)  # the error was reported, not a crash


def test_a_port_held_by_an_outgoing_connection_counts_as_taken() -> None:
    """The local end of a connection (ports in the ephemeral range are handed out for those)
    blocks a server from binding the port just as a listener does; probing with connect()
    missed it and the stack then failed to start with "Address already in use"."""
    import socket

    from services.cli.stack import _port_in_use

    with socket.socket() as listener, socket.socket() as client:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        client.connect(listener.getsockname())
        server_end, _ = listener.accept()
        with server_end:
            local_port = client.getsockname()[1]
            assert _port_in_use(local_port)  # nothing listens there, yet it cannot be bound
            assert _port_in_use(listener.getsockname()[1])
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    assert not _port_in_use(free)


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

    from shared.ingest.embedding import get_embedder

    embedder = get_embedder()
    texts = ["short one", "a much longer passage about harbours " * 20, "mid length text " * 5]
    texts = texts * 3 + ["x"]
    vectors = embedder.embed_passages(texts)
    one_by_one = embedder.model().encode(texts, batch_size=1, normalize_embeddings=True)
    assert vectors.shape == (len(texts), embedder.settings.embedding_dim)
    assert np.min(np.sum(vectors * one_by_one, axis=1)) > 0.99999
    assert embedder.embed_passages([]).shape == (0, embedder.settings.embedding_dim)


def test_event_batcher_groups_by_count_and_by_content_size() -> None:
    from shared.ingest import upload_event
    from shared.ingest.upload_event import EventBatcher

    sent: list[list[str]] = []
    batcher = EventBatcher(lambda events: sent.append([e["external_id"] for e in events]))
    small = [{"external_id": f"s{i}", "content_base64": "QQ=="} for i in range(40)]
    published = sum(batcher.add(e) for e in small)
    assert published == upload_event.EVENTS_PER_MESSAGE and len(sent) == 1
    big = {"external_id": "big", "content_base64": "Q" * upload_event.BYTES_PER_MESSAGE}
    assert batcher.add(big) == 40 - upload_event.EVENTS_PER_MESSAGE  # the big one goes alone
    assert batcher.flush() == 1 and batcher.flush() == 0
    assert [len(m) for m in sent] == [32, 8, 1] and sent[-1] == ["big"]


def test_the_schemathesis_hook_reads_a_form_as_sent_and_keeps_real_violations() -> None:
    from tests.schemathesis_hooks import form_as_sent_is_valid

    schema = {
        "type": "object",
        "required": ["file"],
        "properties": {
            "file": {"type": "string", "format": "binary", "minLength": 1},
            "title": {"type": "string", "maxLength": 1000},
        },
    }

    def form(*parts: tuple[str, bytes, str | None]) -> bytes:
        body = b""
        for name, value, filename in parts:
            disposition = f'form-data; name="{name}"' + (
                f'; filename="{filename}"' if filename else ""
            )
            body += f"--b\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + value + b"\r\n"
        return body + b"--b--\r\n"

    content_type = "multipart/form-data; boundary=b"
    upload = ("file", b"h+\xff", "file")
    # The case CI reported: a "number" title reaches the server as text.
    assert form_as_sent_is_valid(
        form(upload, ("title", b"-1.164545836139942e-293", None)), content_type, schema
    )
    assert not form_as_sent_is_valid(
        form(upload, ("title", b"t" * 1001, None)), content_type, schema
    )
    assert not form_as_sent_is_valid(form(("title", b"no file", None)), content_type, schema)
    assert not form_as_sent_is_valid(
        form(upload, ("title", b"short", None), ("title", b"t" * 1001, None)), content_type, schema
    )


def test_a_long_word_is_cut_to_the_character_cap():
    """One 200,000-character word is a single unknown token for WordPiece: without a cap in
    characters it would be one enormous chunk."""
    text = "Start. " + "x" * 200_000 + " end of the story."
    chunks = Chunker(word_offsets, max_tokens=16, overlap_tokens=0, max_chars=1000).chunk(
        parse(text.encode(), "text/plain")
    )
    assert max(len(c.text) for c in chunks) <= 1000
    assert sum(c.text.count("x") for c in chunks) == 200_000
    doc_text = parse(text.encode(), "text/plain").text
    assert all(doc_text[c.char_start : c.char_end] == c.text for c in chunks)


def test_markdown_headings_parse_in_linear_time():
    """The former heading pattern backtracked over a long line of spaces: quadratic."""
    import time

    def parse_time(n: int) -> float:
        line = "# a" + " " * n + "b\n"
        started = time.perf_counter()
        doc = parse((line + "Body text.\n").encode(), "text/markdown")
        assert doc.sections and doc.sections[0].path.startswith("a")
        return time.perf_counter() - started

    small, large = parse_time(5_000), parse_time(50_000)
    # Linear: 10x the input costs about 10x (quadratic would be about 100x). Generous, since
    # the machine is shared; the former pattern took seconds at 50,000.
    assert large < max(small * 30, 0.05), (small, large)


def test_section_lookup_bisects_and_keeps_heading_paths_bounded():
    md = "".join(f"# Heading {i}\nText of part {i}.\n" for i in range(2000))
    md += "# " + "long " * 1000 + "\nLast part.\n"
    doc = parse(md.encode(), "text/markdown")
    assert doc.section_at(0) == "Heading 0"
    assert doc.section_at(doc.text.index("Text of part 1234.")) == "Heading 1234"
    assert doc.section_at(len(doc.text) - 1).startswith("long")
    assert all(len(s.path) <= 500 for s in doc.sections)


def _candidates(n: int, documents: int, seed: int = 7) -> list[Any]:
    import numpy as np

    from shared.search.policy import Candidate

    rng = np.random.default_rng(seed)
    vectors = rng.normal(size=(n, 16)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return [
        Candidate(
            chunk_id=f"d{i % documents}:{i}",
            document_id=f"d{i % documents}",
            external_id=None,
            title="",
            version=1,
            section="",
            char_start=0,
            char_end=1,
            indexed_at=None,
            text="",
            token_count=1,
            embedding=vectors[i],
            scores={"dense_cosine": float(rng.uniform())},
        )
        for i in range(n)
    ]


def test_mmr_picks_what_the_textbook_algorithm_picks_without_its_cubic_cost():
    from shared.search.service import _cap_per_document, _mmr

    def textbook(candidates: list[Any], lambda_: float) -> list[Any]:
        chosen: list[Any] = []
        remaining = list(candidates)

        def value(c: Any) -> float:
            redundancy = max((float(c.embedding @ s.embedding) for s in chosen), default=0.0)
            return float(lambda_ * c.scores["dense_cosine"] - (1 - lambda_) * redundancy)

        while remaining:
            best = max(remaining, key=value)
            chosen.append(best)
            remaining.remove(best)
        return chosen

    for cap in (None, 2):
        candidates = _candidates(80, documents=10)
        expected = _cap_per_document(textbook(candidates, 0.7), cap)[:10]
        got = _cap_per_document(_mmr(candidates, 0.7, 10, cap), cap)[:10]
        assert [c.chunk_id for c in got] == [c.chunk_id for c in expected]
    # 2,000 candidates (the deepest a request can ask for): picks top_k, not every candidate.
    many = _candidates(2000, documents=3)
    assert len(_mmr(many, 0.5, 10, 1)) == 2000


def test_hydration_for_a_per_document_cap_stops_at_the_candidate_window(monkeypatch):
    from shared.search import service
    from shared.search.schemas import SearchRequest
    from shared.settings import Settings

    hydrated: list[int] = []

    def fake_hydrate(tenant_id, fused, vector, likely):
        hydrated.append(len(fused))
        return _candidates(len(fused), documents=1), 0

    monkeypatch.setattr(service, "_hydrate", fake_hydrate)
    fused = [(f"d0:{i}", 1.0 / (i + 1)) for i in range(2000)]
    request = SearchRequest.model_validate(
        {"query": "q", "top_k": 10, "per_document_cap": 1, "mmr": {"lambda": 0.5}}
    )
    settings = Settings(search_candidate_window=100)
    candidates, _ = service._hydrate_enough("t", fused, [0.0], request, settings)
    assert len(candidates) <= 100 + max(hydrated)  # one slice past the window at most
    assert sum(hydrated) < 2000


def test_intake_bounds_stay_linear_and_refuse_with_a_4xx():
    """An unclosed JSON string full of escaped quotes made the string pattern rescan the rest
    of the input from every quote (quadratic); out-of-range dates and huge integers raised
    errors that were not 4xx."""
    import time

    from shared.errors import BadRequest
    from shared.ingest.intake import check_json_structure
    from shared.ingest.service import check_metadata
    from shared.search.filters import _encode_date, parse_iso_date, range_terms

    def scan_time(n: int) -> float:
        started = time.perf_counter()
        check_json_structure(b'"' + b'\\"' * n, lines=False)
        return time.perf_counter() - started

    small, large = scan_time(20_000), scan_time(200_000)
    assert large < max(small * 30, 0.05), (small, large)
    for value in ("0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00", "2024-13-45"):
        with pytest.raises(ValueError):
            parse_iso_date(value)
        with pytest.raises(BadRequest):
            check_metadata({"published": value})
    with pytest.raises(BadRequest):
        check_metadata({"n": 10**400})
    with pytest.raises(BadRequest):
        check_metadata({"k\n": 1})
    assert range_terms({"n": 10**400}) == []  # stored before the check: no range, no crash
    assert _encode_date("0999-01-01") < _encode_date("2024-01-01")
