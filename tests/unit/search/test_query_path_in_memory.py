"""The query path's stages (retrieve → fuse → hydrate → rerank/diversify → decide → respond)
on the in-memory stores, with the real embedding model and no service running: what each
mode finds, how a stale hit and a store that fails are handled, and how pages follow one
ranking. The same stages run on the real stores in tests/integration/search."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any, cast

import pytest
from sqlalchemy.orm import Session

from shared.errors import StoreUnavailable
from shared.ingest.embedding import get_embedder
from shared.search.coverage import CorpusCounts
from shared.search.fusion import fused_ranking
from shared.search.retrieve import retrieve
from shared.search.schemas import SearchRequest
from shared.search.service import page_of
from shared.search.values import NOTHING_READ_AHEAD, Query
from shared.settings import Settings, get_settings
from shared.stores.compose import Stores
from shared.stores.memory import memory_stores
from shared.stores.schemas import ChunkRow, VersionChunks, chunk_id
from shared.timing import StageTimes

# The in-memory vector store is the same in every transaction: none is opened.
NO_TRANSACTION = cast(Session, None)
TENANT = "acme"
NOTES = {
    "tides": ["Tides rise and fall twice a day, pulled by the moon's gravity."],
    "bread": [
        "A sourdough starter is a culture of wild yeast and bacteria.",
        "Feed the starter once a day with equal weights of flour and water.",
    ],
    "bikes": ["Oil the bicycle chain every few hundred kilometres to stop rust."],
    "seals": ["Harbour seals haul out on sandbanks at low tide."],
}


def _write(
    stores: Stores,
    tenant: str,
    external_id: str,
    texts: list[str],
    version: int = 1,
    indexed: bool = True,
) -> str:
    """One document's chunks in the vector store and (``indexed``) their copies in the
    index, as the pipeline and the relay write them."""
    document = uuid.uuid5(uuid.NAMESPACE_URL, f"{tenant}/{external_id}")
    vectors = get_embedder().embed_passages(texts)
    rows = [
        ChunkRow(
            id=chunk_id(document, i),
            ordinal=i,
            text=text,
            text_hash=f"h{i}",
            char_start=0,
            char_end=len(text),
            section="",
            token_count=len(text.split()),
            embedding=vector,
        )
        for i, (text, vector) in enumerate(zip(texts, vectors, strict=True))
    ]
    version_chunks = VersionChunks(tenant, document, version, external_id, external_id, {}, rows)
    store = stores.vectors(NO_TRANSACTION)
    store.upsert([version_chunks])
    if indexed:
        copies = [
            (c, d) for c, d in store.page_after("", 10_000, tenant) if c.document_id == document
        ]
        stores.index.write(copies, "external")
    return str(document)


@pytest.fixture
def stores() -> Stores:
    stores = memory_stores()
    for external_id, texts in NOTES.items():
        _write(stores, TENANT, external_id, texts)
    _write(stores, "other", "tides", ["Tides of another tenant, word for word the same."])
    return stores


def _search(stores: Stores, query: str, **options: Any) -> Any:
    request = SearchRequest.model_validate({"query": query, **options})
    q = Query(TENANT, request, get_settings())
    timings = StageTimes(scale=1e3, digits=3)
    vectors = stores.vectors(NO_TRANSACTION)
    arms = retrieve(q, index=stores.index, vectors=vectors, timings=timings)
    retrieved = fused_ranking(q, arms, vectors=vectors, timings=timings)
    return (
        page_of(q, retrieved, timings, vectors=vectors, snapshots=stores.snapshots),
        retrieved,
        timings,
    )


@pytest.mark.parametrize("mode", ["hybrid", "dense", "lexical"])
def test_every_mode_finds_the_answer_within_the_tenant(stores: Stores, mode: str) -> None:
    response, retrieved, _ = _search(
        stores, "how often do I feed the starter flour and water", mode=mode
    )
    assert response.results[0].text.startswith("Feed the starter once a day")
    assert {r.external_id for r in response.results} <= set(NOTES)  # never the other tenant's
    assert set(retrieved.arms) == ({"dense", "lexical"} if mode == "hybrid" else {mode})
    assert response.decision.status in ("answerable", "verify")


def test_a_question_far_from_the_corpus_is_not_answered(stores: Stores) -> None:
    response, _, _ = _search(stores, "what is the capital of mongolia")
    assert response.decision.status == "abstain"


def test_a_copy_the_vector_store_no_longer_holds_is_dropped_and_named_for_its_purge(
    stores: Stores,
) -> None:
    """Version 2 of the bread notes has one chunk: the index still holds version 1's second
    chunk (its delete not relayed yet), and the search must not serve it."""
    new_text = ["Bread notes moved to the bakery wiki."]
    document = uuid.UUID(_write(stores, TENANT, "bread", new_text, version=2, indexed=False))
    stores.vectors(NO_TRANSACTION).delete_superseded({document: 2}, chunk_counts={document: 1})
    response, retrieved, _ = _search(
        stores, "feed the starter with flour and water", mode="lexical"
    )
    assert f"{document}:1" in response._stale and response.dropped_stale >= 1
    # Read ahead by the passages stage, whose rows lack it: dropped without a second read.
    assert f"{document}:1" in retrieved.read_ahead.ids - set(retrieved.read_ahead.rows)
    assert not any("Feed the starter" in r.text for r in response.results)


def test_one_store_failing_degrades_to_the_other(
    stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unavailable(*args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable("Elasticsearch is unreachable", store="Elasticsearch")

    monkeypatch.setattr(stores.index, "lexical_search", unavailable)
    response, retrieved, _ = _search(stores, "harbour seals at low tide")
    assert retrieved.degraded == ["lexical_unavailable"]
    assert response.results[0].external_id == "seals"


def test_pages_follow_one_ranking_without_repeats(stores: Stores) -> None:
    first, retrieved, timings = _search(stores, "tides seals bread bikes", top_k=2, paginate=True)
    q = Query(TENANT, SearchRequest(query="x", top_k=2, paginate=True), get_settings())
    second = page_of(
        q,
        retrieved,
        timings,
        vectors=stores.vectors(NO_TRANSACTION),
        snapshots=stores.snapshots,
        offset=2,
    )
    seen = [r.chunk_id for r in first.results] + [r.chunk_id for r in second.results]
    assert len(seen) == len(set(seen)) == 4
    position = {cid: i for i, (cid, _) in enumerate(retrieved.fused)}
    assert max(position[r.chunk_id] for r in first.results) < min(
        position[r.chunk_id] for r in second.results
    )  # page 2 starts where page 1 ended in the one stored ranking
    assert first.next_cursor is not None  # the ranking was kept for the next pages


def test_the_first_page_takes_the_passages_stages_read_and_reads_no_chunk_twice(
    stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    vectors = stores.vectors(NO_TRANSACTION)
    reads: list[list[str]] = []
    read = vectors.hydrate

    def recorded(tenant_id: str, ids: Any, vector: Any, embeddings_for: Any = ()) -> Any:
        reads.append(list(ids))
        return read(tenant_id, ids, vector, embeddings_for)

    monkeypatch.setattr(vectors, "hydrate", recorded)
    question = "how often do I feed the starter flour and water"
    response, retrieved, timings = _search(stores, question)
    assert retrieved.read_ahead.ids == set(reads[0])  # the passages stage's read
    assert len(reads) == 1  # every result was among its rows: hydration read nothing
    assert all(r.chunk_id in retrieved.read_ahead.rows for r in response.results)
    # The same page read afresh, without the rows read ahead: the same results and scores.
    q = Query(TENANT, SearchRequest(query=question), get_settings())
    afresh = page_of(
        q,
        dataclasses.replace(retrieved, read_ahead=NOTHING_READ_AHEAD),
        timings,
        vectors=vectors,
        snapshots=stores.snapshots,
    )
    assert len(reads) == 2
    assert [r.model_dump() for r in afresh.results] == [r.model_dump() for r in response.results]


# Notes on threads (from libtasn1's, libffi's and Valgrind's manuals): libffi's say more
# about threads, libtasn1's title names what the question is about.
THREAD_NOTES = {
    "libtasn1": [
        "Libtasn1 is a library for Abstract Syntax Notation One (ASN.1) and Distinguished "
        "Encoding Rules (DER) manipulation.",
        "Thread safety: the library is re-entrant. No global variables are used and multiple "
        "library handles and session handles may be used in parallel.",
    ],
    "libffi-thread-safety": [
        "libffi is not completely thread-safe. However, many parts are, and if you follow "
        "some simple rules, you can use it safely in a multi-threaded program.",
        "ffi_prep_cif may allocate memory; it is safe to call it from multiple threads as "
        "long as each thread uses its own ffi_cif.",
    ],
    "valgrind-core": [
        "Valgrind serialises execution so that only one thread runs at a time, which makes "
        "multiple threads safe to debug.",
    ],
}


@pytest.mark.parametrize("title_lift", [0.0, get_settings().search_title_lift])
def test_the_document_whose_title_names_the_subject_is_lifted(title_lift: float) -> None:
    stores = memory_stores()
    for external_id, texts in THREAD_NOTES.items():  # _write titles each by its external id
        _write(stores, TENANT, external_id, texts)
    # the name lift aside: "libtasn1", a name with a digit, is one the question writes
    settings = get_settings().model_copy(
        update={"search_title_lift": title_lift, "search_name_lift": 0.0}
    )
    request = SearchRequest(query="can i call libtasn1 from a bunch of threads at once")
    query = Query(TENANT, request, settings)
    timings, vectors = StageTimes(), stores.vectors(NO_TRANSACTION)
    arms = retrieve(query, index=stores.index, vectors=vectors, timings=timings)
    fused = fused_ranking(query, arms, vectors=vectors, timings=timings).fused
    rows = vectors.hydrate(TENANT, [cid for cid, _ in fused], None)
    first_two = [rows[cid].title for cid, _ in fused[:2]]
    # Without the lift libffi's two chunks come first; with the default, libtasn1's first
    # chunk passes libffi's second.
    assert ("libtasn1" in first_two) == (title_lift > 0), first_two


# Two pages on sizes: one matches the question's words everywhere, the other writes its option.
SIZE_NOTES = {
    "disk-usage": [
        "A bare size number with no suffix is read in units of 1024 bytes; a suffix such as "
        "K, M or G gives another unit.",
        "Sizes are printed in units of 1024 bytes unless a size suffix is given.",
        "The block size is a number of bytes; a suffix gives it in another unit.",
    ],
    "ordering": [
        "-S, --buffer-size=SIZE  use SIZE for the main memory buffer.",
        "-r, --reverse  reverse the result of comparisons.",
    ],
}


SIZE_QUESTION = "what unit is a bare number with no suffix in --buffer-size"


def _size_notes_order(
    settings: Settings, request: SearchRequest, counts_known: bool = True
) -> list[str]:
    """The titles of SIZE_NOTES' chunks in the fused ranking of ``request``."""
    stores = memory_stores()
    for external_id, texts in SIZE_NOTES.items():
        _write(stores, TENANT, external_id, texts)
    query = Query(TENANT, request, settings)
    timings, vectors = StageTimes(), stores.vectors(NO_TRANSACTION)
    arms = retrieve(query, index=stores.index, vectors=vectors, timings=timings)
    if not counts_known:  # as when Elasticsearch could not count the terms in time
        arms = dataclasses.replace(arms, counts=CorpusCounts.unknown())
    fused = fused_ranking(query, arms, vectors=vectors, timings=timings).fused
    rows = vectors.hydrate(TENANT, [cid for cid, _ in fused], None)
    return [rows[cid].title for cid, _ in fused]


@pytest.mark.parametrize("name_lift", [0.0, get_settings().search_name_lift])
def test_the_document_that_writes_the_questions_option_is_lifted(name_lift: float) -> None:
    settings = get_settings().model_copy(update={"search_name_lift": name_lift})
    order = _size_notes_order(settings, SearchRequest(query=SIZE_QUESTION))
    # Without the lift the page on sizes, which holds the question's words, comes first; with
    # the default, the page that writes --buffer-size does.
    assert order[0] == ("ordering" if name_lift else "disk-usage"), order


def test_names_lift_without_the_corpus_counts_and_not_under_a_boost() -> None:
    settings = get_settings()
    # Exact names need no term weights: where Elasticsearch could not count, they still lift.
    order = _size_notes_order(settings, SearchRequest(query=SIZE_QUESTION), counts_known=False)
    assert order[0] == "ordering", order
    # A request's boost has the last word on the order of documents (no chunk has the field:
    # the boost moves nothing, and nor does the lift).
    boosted = SearchRequest(query=SIZE_QUESTION, boost={"field": "year", "kind": "numeric"})
    order = _size_notes_order(settings, boosted)
    assert order[0] == "disk-usage", order
