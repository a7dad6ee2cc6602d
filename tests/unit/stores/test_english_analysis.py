"""The Python English analysis BM25 reads (shared/stores/english_analysis.py)."""

from __future__ import annotations


def test_identifiers_are_searchable_by_their_parts_and_as_a_whole() -> None:
    """A chunk that says serialization_failure is found by "serialization failure", and one
    that says --files-without-match by that option as typed (its words match too)."""
    from shared.stores.english_analysis import analyze

    def terms(text: str) -> set[str]:
        return set(analyze(text).split())

    assert terms("serialization failure") <= terms("retry on serialization_failure")
    assert "serialization_failur" in terms("serialization_failure")
    assert terms("get element id") <= terms("document.getElementById(x)")
    assert {"files-without-match", "file", "without", "match"} <= terms("--files-without-match")
    assert {"path.format", "path", "format", "3.8.1"} <= terms("path.format() since 3.8.1")
    assert analyze("plain prose, nothing joined") == "plain prose noth join"


def test_identifier_terms_start_where_a_name_starts() -> None:
    """The patterns are anchored at a word's start (an ASCII run's, for camelCase and
    snake_case) for speed; the terms are what the unanchored patterns found."""
    from shared.stores.english_analysis import identifier_terms

    assert identifier_terms("über_x") == ["ber", "x"]  # the ASCII run after "ü"
    assert identifier_terms("a..b 1.2. -a.b- x.y.z") == ["1.2", "a.b", "x.y.z"]
    assert identifier_terms("getHTTPResponse_code") == ["get", "http", "respons", "code"]
    assert identifier_terms("see path.format.") == ["path.format"]


def test_english_analysis_drops_possessives_and_stop_words_then_stems() -> None:
    """What Lucene's EnglishAnalyzer makes of text: the possessive 's (straight or curly) goes,
    other apostrophes stay, stop words go, the rest is Porter-stemmed; the cached variant for
    titles and sections gives the same."""
    from shared.stores.english_analysis import analyze, analyze_repeated

    cases = {
        "The cat's toys": "cat toi",
        "James\u2019s running studies": "jame run studi",
        "O'Neil's books and the rest": "o'neil book rest",
        "x's's": "x'",
        "it is not such a thing": "thing",
        "": "",
    }
    for text, expected in cases.items():
        assert analyze(text) == expected
        assert analyze_repeated(text) == expected
