"""The title lift (shared/search/titles.py): among the first candidates, a document whose title
names the question's most specific term comes before one that only matches its other words;
each document's chunks keep their order, and nothing past the window moves."""

from __future__ import annotations

from shared.search.coverage import CorpusCounts
from shared.search.passages import Question
from shared.search.titles import lift_titled_documents, title_shares
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


def test_the_titled_document_is_lifted_and_its_chunks_keep_their_order() -> None:
    fused = [("xargs:0", 0.9), ("timeout:0", 0.8), ("ls:0", 0.7), ("xargs:1", 0.6), ("ls:1", 0.5)]
    shares = {"ls:0": 1.0, "ls:1": 1.0}
    lifted = lift_titled_documents(fused, shares, window=5, lift=0.5)
    assert [cid for cid, _ in lifted] == ["ls:0", "ls:1", "xargs:0", "timeout:0", "xargs:1"]
    # a lift worth less than the places between them moves nothing
    assert lift_titled_documents(fused, shares, window=5, lift=0.05) == fused
    # the window bounds what moves: ls:1, past it, stays where it was
    within_three = lift_titled_documents(fused, shares, window=3, lift=0.5)
    assert [cid for cid, _ in within_three] == ["ls:0", "xargs:0", "timeout:0", "xargs:1", "ls:1"]
    assert lift_titled_documents(fused, {}, window=5, lift=0.5) == fused
