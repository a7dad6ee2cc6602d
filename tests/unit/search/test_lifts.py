"""The lifts (shared/search/lifts.py): among the first candidates, a document whose title
names the question's most specific term, or whose chunks write its exact names, comes before
one that only matches its other words; each document's chunks keep their order, and nothing
past the window moves."""

from __future__ import annotations

from shared.search.coverage import CorpusCounts
from shared.search.lifts import document_lifts, lift_documents, name_shares, title_shares
from shared.search.passages import Question
from shared.stores.schemas import ChunkText

# "ls" (stemmed "l") is in few chunks of the corpus, "file" and "status" in many.
COUNTS = CorpusCounts(
    1000,
    {"exit": 60, "statu": 90, "l": 6, "return": 120, "access": 40, "file": 400, "cannot": 300},
)
QUESTION = Question.of("What exit status does ls return when it cannot access a file?", COUNTS)


def _text(title: str) -> ChunkText:
    return ChunkText("(the chunk's text does not count here)", "", title)


def test_a_title_shares_the_weight_of_the_heaviest_question_term_it_holds() -> None:
    shares = title_shares(
        QUESTION,
        COUNTS,
        {
            "ls:0": _text("man-ls"),  # the question's rarest term: all of it
            "files:0": _text("File handling"),  # a common term of the question: a part
            "xargs:0": _text("man-xargs"),  # none: left out
        },
    )
    assert shares["ls:0"] == 1.0
    assert 0 < shares["files:0"] < 0.5
    assert "xargs:0" not in shares
    assert title_shares(Question.of("what", COUNTS), COUNTS, {"ls:0": _text("man-ls")}) == {}
    # A word the corpus holds nowhere is in no title: the heaviest term held is the measure.
    casual = Question.of("What exit code does ls spit out?", COUNTS)
    assert title_shares(casual, COUNTS, {"ls:0": _text("man-ls")}) == {"ls:0": 1.0}


def test_a_sentence_for_a_title_or_unknown_weights_lift_nothing() -> None:
    sentence = _text("Exit status of ls and of other commands, in the order of their return")
    assert title_shares(QUESTION, COUNTS, {"ls:0": sentence}) == {}
    # Without the corpus's counts every term would weigh the same, "file" as much as "ls".
    unknown = CorpusCounts.unknown()
    assert title_shares(QUESTION, unknown, {"files:0": _text("File handling")}) == {}
    assert title_shares(QUESTION, None, {"ls:0": _text("man-ls")}) == {}


def test_the_lifted_document_moves_up_and_its_chunks_keep_their_order() -> None:
    fused = [("xargs:0", 0.9), ("timeout:0", 0.8), ("ls:0", 0.7), ("xargs:1", 0.6), ("ls:1", 0.5)]
    lifts = {"ls:0": 0.5, "ls:1": 0.5}
    lifted = lift_documents(fused, lifts, window=5)
    assert [cid for cid, _ in lifted] == ["ls:0", "ls:1", "xargs:0", "timeout:0", "xargs:1"]
    # a lift worth less than the places between them moves nothing
    assert lift_documents(fused, {"ls:0": 0.05, "ls:1": 0.05}, window=5) == fused
    # the window bounds what moves: ls:1, past it, stays where it was
    within_three = lift_documents(fused, lifts, window=3)
    assert [cid for cid, _ in within_three] == ["ls:0", "xargs:0", "timeout:0", "xargs:1", "ls:1"]
    assert lift_documents(fused, {}, window=5) == fused


SORT_QUESTION = Question.of(
    "If I give sort --buffer-size a bare number with no suffix, what unit is it in?", COUNTS
)


def test_a_document_shares_the_name_share_of_its_chunk_that_writes_the_names() -> None:
    texts = {
        "sort:0": ChunkText("-S, --buffer-size=SIZE  use SIZE for main memory buffer", "", "s"),
        "sort:1": ChunkText("-r, --reverse  reverse the result of comparisons", "", "s"),
        # the words of the name, not the name: BM25 matches it, the lift does not
        "du:0": ChunkText("print sizes; the buffer size of a block is 1024", "", "du"),
        # an option whose name holds the name's start is another option
        "ls:0": ChunkText("--buffer-sizes  is no option of sort's", "", "ls"),
    }
    assert name_shares(SORT_QUESTION, texts) == {"sort:0": 1.0, "sort:1": 1.0}
    # a question without an exact name lifts nothing
    assert name_shares(QUESTION, texts) == {}


def test_a_section_heading_that_writes_the_name_counts_as_its_chunk_writing_it() -> None:
    heading = "OPTIONS > --buffer-size"
    texts = {"sort:0": ChunkText("use SIZE for the main memory buffer", heading, "s")}
    assert name_shares(SORT_QUESTION, texts) == {"sort:0": 1.0}


def test_the_lifts_add_the_title_share_and_the_name_share_each_times_its_lift() -> None:
    texts = {
        "sort:0": ChunkText("-S, --buffer-size=SIZE  use SIZE for the buffer", "", "man-sort"),
        "du:0": ChunkText("print sizes; the buffer size of a block is 1024", "", "man-du"),
    }
    counts = CorpusCounts(1000, {"sort": 10, "buffer": 50, "size": 300, "bare": 20, "number": 200})
    lifts = document_lifts(SORT_QUESTION, counts, texts, title_lift=0.2, name_lift=0.1)
    title = title_shares(SORT_QUESTION, counts, texts)["sort:0"]
    assert lifts == {"sort:0": 0.2 * title + 0.1}
    assert document_lifts(SORT_QUESTION, counts, texts, title_lift=0.0, name_lift=0.1) == {
        "sort:0": 0.1
    }
    assert document_lifts(SORT_QUESTION, counts, texts, title_lift=0.0, name_lift=0.0) == {}
