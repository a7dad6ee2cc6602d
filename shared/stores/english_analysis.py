"""English analysis for the BM25 index, done in Python.

The Elasticsearch integ-test distribution ships no ``analysis-common`` module, so it has no
``english`` analyzer and no stemmer. Concord therefore analyzes text itself the way Lucene's
EnglishAnalyzer does (lowercase, possessive ``'s`` removed, Lucene's English stop words,
Porter stemmer) and indexes the result in ``stemmed.*`` fields with Elasticsearch's
``whitespace`` analyzer; queries go through the same function. With a full Elasticsearch set
``CONCORD_LEXICAL_ANALYSIS=elasticsearch`` and ``CONCORD_ES_TEXT_ANALYZER=english`` instead,
then run ``concord reindex`` (an index indexes the fields of one analysis only).
"""

from __future__ import annotations

import re
from functools import lru_cache

import Stemmer

# org.apache.lucene.analysis.en.EnglishAnalyzer.ENGLISH_STOP_WORDS_SET
STOP_WORDS = frozenset(
    {
        "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into",
        "is", "it", "no", "not", "of", "on", "or", "such", "that", "the", "their", "then",
        "there", "these", "they", "this", "to", "was", "will", "with",
    }
)  # fmt: skip
_TOKEN = re.compile(r"\w+(?:['\u2019]\w+)*")


@lru_cache(maxsize=1)
def _stemmer() -> Stemmer.Stemmer:
    return Stemmer.Stemmer("porter")


# Identifiers, searchable by their parts and as a whole: a name joined by underscores or
# written in camelCase is one token above (its parts are added), one joined by dots or
# hyphens (path.format, --files-without-match, 3.8.1) is its parts above (the whole is added,
# as written, unstemmed). Each starts where a word (or its ASCII run) starts, and a joined
# name's words are not given back (``++``): the matches are the same, and the scan no longer
# retries from every letter of every word (over the dev set's results and SciFact's abstracts,
# 11,931 texts: the same terms for each; identifier_terms 2.9 -> 0.9 s, analyze 3.8 -> 2.0 s).
_JOINED = re.compile(r"(?<!\w)\w++(?:[.\-]\w++)+")
_CAMEL_OR_SNAKE = re.compile(r"(?<![A-Za-z0-9])[A-Za-z0-9]*(?:_[A-Za-z0-9]|[a-z0-9][A-Z])\w*")
_PARTS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")


def analyze(text: str) -> str:
    """Space-separated stemmed terms of ``text`` (stop words dropped), then the parts and
    wholes of its identifiers (``identifier_terms``)."""
    kept = [w for w in _words(text) if w and w not in STOP_WORDS]
    return " ".join([*_stemmer().stemWords(kept), *identifier_terms(text)])


def identifier_terms(text: str) -> list[str]:
    """The terms an identifier adds to its words: ``serialization_failure`` its stemmed
    parts (serial, failur), ``camelCase`` its parts (camel, case), ``path.format`` and
    ``--files-without-match`` their whole (path.format, files-without-match). A text
    without such names (most prose) adds nothing and costs two regex scans."""
    extra: list[str] = []
    if "_" in text or not text.islower():
        parts = []
        for match in _CAMEL_OR_SNAKE.finditer(text):
            found = [p.lower() for p in _PARTS.findall(match.group())]
            if len(found) > 1:
                parts += [p for p in found if p not in STOP_WORDS]
        extra += _stemmer().stemWords(parts) if parts else []  # one call for the whole text
    if "." in text or "-" in text:
        extra += [m.group().lower() for m in _JOINED.finditer(text)]
    return extra


def _words(text: str) -> list[str]:
    """The lowercased words of ``text``, each without a trailing 's. Only a text holding an
    apostrophe pays a call per word (most hold none: stemmed_words 1.03 -> 0.90 s, analyze
    2.05 -> 1.89 s over the dev set's results and SciFact's abstracts, the same terms)."""
    lowered = text.lower()
    words: list[str] = _TOKEN.findall(lowered)
    if "'" in lowered or "\u2019" in lowered:
        return [_without_possessive(w) for w in words]
    return words


def _without_possessive(word: str) -> str:
    """The word without a trailing 's (straight or curly), without a regex call per word:
    the relay analyzes every chunk it sends, and this took a third less time."""
    if len(word) > 1 and word[-1] == "s" and word[-2] in "'\u2019":
        return word[:-2]
    return word


@lru_cache(maxsize=4096)
def analyze_repeated(text: str) -> str:
    """:func:`analyze` for the short fields every chunk of a document repeats (its title and
    section): each analyzed once per process, not once per chunk."""
    return analyze(text)


def stemmed_words(text: str) -> list[str]:
    """The kept terms of ``text`` in order, as :func:`term_spans` gives them, without their
    offsets (two fifths faster, for a search that reads the order of its candidates' words)."""
    kept = [w for w in _words(text) if w and w not in STOP_WORDS]
    return _stemmer().stemWords(kept)  # type: ignore[no-any-return]


def term_spans(text: str) -> list[tuple[int, int, str]]:
    """Each kept term of ``text`` as (start, end, stemmed term): the character offsets of the
    word :func:`analyze` turns into that term, so a match can be shown where it is."""
    spans = []
    words = [
        (m.start(), m.end(), _without_possessive(m.group().lower())) for m in _TOKEN.finditer(text)
    ]
    kept = [(s, e, w) for s, e, w in words if w and w not in STOP_WORDS]
    for (start, end, _), term in zip(
        kept, _stemmer().stemWords([w for _, _, w in kept]), strict=True
    ):
        spans.append((start, end, term))
    return spans
