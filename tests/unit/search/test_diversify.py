"""Diversify (shared/search/diversify.py): crumbs go after the page's other results."""

from __future__ import annotations

from dataclasses import replace

from shared.search.diversify import CRUMB_WORDS, crumbs_last
from tests.unit.search.test_units import _candidates


def test_crumbs_follow_the_other_results_in_their_order() -> None:
    """A man page's SEE ALSO line, a rule of dashes and a two-line code fragment reached the
    first five results of real-document questions (0.2-0.3 % of them)."""
    texts = [
        "Full documentation <https://www.gnu.org/software/coreutils/cut>",
        "cut prints selected parts of lines from each FILE to standard output, by bytes or fields.",
        "-" * 80,
        "With no FILE, or when FILE is -, read standard input; mandatory arguments apply too.",
        "```\nmin-release-age=7\n```",
    ]
    candidates = [replace(c, text=t) for c, t in zip(_candidates(5, 5), texts, strict=True)]
    ordered = crumbs_last(candidates)
    assert [c.text for c in ordered] == [texts[1], texts[3], texts[0], texts[2], texts[4]]
    assert all(len(c.text.split()) >= CRUMB_WORDS for c in ordered[:2])
    assert crumbs_last(ordered[:2]) == ordered[:2]


def test_a_whole_short_document_is_not_a_crumb() -> None:
    """A document of one short sentence is its own answer: it keeps its place, while a crumb
    of a longer document of the same length still goes last."""
    texts = [
        "Glaciers grind rock into fine silt.",
        "Rivers carry the silt that glaciers leave behind them down to the sea each spring.",
        "See also: moraine, till.",
    ]
    candidates = [replace(c, text=t) for c, t in zip(_candidates(3, 3), texts, strict=True)]
    candidates[0] = replace(candidates[0], whole_document=True)
    ordered = crumbs_last(candidates)
    assert [c.text for c in ordered] == [texts[0], texts[1], texts[2]]
