"""Diversify (shared/search/diversify.py): crumbs go after the page's other results."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shared.search.diversify import CRUMB_WORDS, crumbs_last


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


def _candidates(n: int, documents: int, seed: int = 7) -> list[Any]:
    import numpy as np

    from shared.search.values import Candidate

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
    from shared.search.caps import cap_per_document
    from shared.search.diversify import mmr

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
        expected = cap_per_document(textbook(candidates, 0.7), cap)[:10]
        got = cap_per_document(mmr(candidates, 0.7, 10, cap=cap), cap)[:10]
        assert [c.chunk_id for c in got] == [c.chunk_id for c in expected]
    # 2,000 candidates (the deepest a request can ask for): picks top_k, not every candidate.
    many = _candidates(2000, documents=3)
    assert len(mmr(many, 0.5, 10, cap=1)) == 2000


def test_the_same_page_in_two_formats_is_one_result_naming_both():
    """Node's path page as Markdown and as HTML (chunks of other sizes; backticks and list
    marks in one, "Added in" lines in the other): of two chunks of which one holds nearly
    all of the other's text, the later becomes the earlier's copy. A chunk of another
    section, one of the same document, and a short line the HTML also holds stay results of
    their own."""
    from shared.search.diversify import collapse_copies

    html = (
        "path.delimiter Added in: v0.9.3 <string> Provides the platform-specific path "
        "delimiter: ; for Windows : for POSIX For example, on POSIX: console.log(process.env."
        "PATH); // Prints: '/usr/bin:/bin:/usr/sbin:/sbin:/usr/local/bin'"
    )
    markdown = (
        "* {string}\n\nProvides the platform-specific path delimiter:\n\n* `;` for Windows\n"
        "* `:` for POSIX\n\nFor example, on POSIX:"
    )
    other_section = (
        "* {string}\n\nProvides the platform-specific path segment separator:\n\n* `\\` on "
        "Windows\n* `/` on POSIX\n\nFor example, on POSIX:"
    )
    candidates = _candidates(5, documents=5)
    for c, (document, text) in zip(
        candidates,
        [
            ("page.html", html),
            ("page.md", markdown),
            ("page.md", other_section),
            ("page.html", markdown),  # the same document's own text again: not a copy
            ("notes.md", "for Windows : for POSIX"),  # under eight trigrams
        ],
        strict=True,
    ):
        c.document_id = c.external_id = document
        c.text = text
    kept = collapse_copies(candidates)
    assert all(not c.copies for c in candidates)  # a new value names them; the inputs stay
    assert [c.text for c in kept] == [html, other_section, markdown, "for Windows : for POSIX"]
    assert [(c.external_id, c.text) for c in kept[0].copies] == [("page.md", markdown)]
    assert all(not c.copies for c in kept[1:])
    # The other way round: the smaller chunk first, then one that holds it all (and more).
    smaller, larger = _candidates(2, documents=2)
    smaller.document_id, smaller.text = "page.md", markdown
    larger.document_id, larger.text = "page.html", html
    assert [(c.text, [o.text for o in c.copies]) for c in collapse_copies([smaller, larger])] == [
        (markdown, [html])
    ]
