"""The evidence pack (shared/search/policy.py): the per-document cap keeps the chunks of a
document that answer the question best."""

from __future__ import annotations

from dataclasses import replace

from shared.search.policy import PolicyConfig, apply_policy
from tests.unit.search.test_coverage import Words
from tests.unit.search.test_units import _candidates


def test_the_cap_yields_to_a_later_chunk_that_answers_better() -> None:
    """Issue 47's tar question: three synopsis chunks of the man page were packed and the
    chunk with the option asked for, fifth in the results, was omitted by the cap of three
    chunks a document."""
    synopsis = ["tar -c [-f ARCHIVE] [OPTIONS] [FILE...]", "tar -r [-f ARCHIVE] [OPTIONS]",
                "tar -t [-f ARCHIVE] [OPTIONS] [MEMBER...]"]  # fmt: skip
    option = "--exclude-vcs  Exclude version control system directories."
    candidates = []
    for i, (c, text, match) in enumerate(
        zip(
            _candidates(5, documents=1),
            [*synopsis, "tar -u [-f ARCHIVE] [OPTIONS]", option],
            [0.3, 0.25, 0.3, 0.2, 0.9],
            strict=True,
        )
    ):
        c = replace(
            c,
            external_id="man-tar.txt",
            text=text,
            char_end=len(text),
            token_count=len(text.split()),
        )
        c.scores["dense_cosine"] = 0.8 - i / 100
        c.answer_match = match
        candidates.append(c)
    config = PolicyConfig("dense_cosine", 0.3, 1000, 3, 0.999)
    result = apply_policy(candidates, config, Words())
    packed = [item.text for item in result.evidence]
    assert option in packed and len(packed) == 3
    # the weakest synopsis chunk made room; the fourth never got in
    assert synopsis[1] not in packed
    assert result.per_result[candidates[1].chunk_id] == "per_document_cap"
    assert result.per_result[candidates[3].chunk_id] == "per_document_cap"
    assert result.tokens_used == sum(item.tokens for item in result.evidence)
    # unmeasured matches (an answerability-model decision): first come, first packed
    for c in candidates:
        c.answer_match = None
    plain = apply_policy(candidates, config, Words())
    assert [item.text for item in plain.evidence] == synopsis
