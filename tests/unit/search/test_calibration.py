"""The calibration's pure parts: questions drawn from a tenant's texts, and the threshold set
between its own questions' best scores and the far ones'."""

from __future__ import annotations

from shared.search.calibration import background_questions, own_questions, threshold


def test_own_questions_are_the_informative_words_of_a_sentence() -> None:
    texts = [
        "The frobctl daemon rotates its spool files every ten minutes by default.",
        "Short.",  # no sentence of six words: no question
        "See below.\nSet --rotate-interval to change how often the spool files rotate.",
    ]
    questions = own_questions(texts, seed="t-1")
    assert len(questions) == 2
    assert questions[0] == "frobctl daemon rotates spool files ten"
    assert all(len(q.split()) <= 6 and "the" not in q.split() for q in questions)
    assert own_questions(texts, seed="t-1") == questions  # the same for one tenant


def test_the_threshold_sits_between_the_samples_or_is_not_set_where_they_overlap() -> None:
    own = [0.30 + i * 0.005 for i in range(100)]  # 0.30 .. 0.795
    far = [0.10 + i * 0.001 for i in range(100)]  # 0.10 .. 0.199
    min_score, low, high = threshold(own, far)
    assert high < min_score < low and min_score == round((low + high) / 2, 4)
    overlapping = [0.25 + i * 0.002 for i in range(100)]  # 0.25 .. 0.448
    assert threshold(own, overlapping)[0] is None
    assert len(background_questions()) >= 80
