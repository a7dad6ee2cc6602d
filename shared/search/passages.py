"""Passages: which chunk of a document answers, when several of its chunks compete.

Long reference documents (a man page's option list, a table of codes, a changelog, a manual
of many similar sections) put many chunks of one document among the first candidates, and
the fused ranking orders them by how much each *mentions* the question: a chunk about the
neighbouring options or versions often comes first, the one that states the answer 6th or
30th (the BM25 arm may find it first while the dense arm does not find it at all). So the
first ``search_passage_window`` fused candidates, and each arm's first three hits wherever
fusion put them (shared/search/fusion.passage_window), are reordered *within each document*, by

* **proximity**: the share of the question's informative terms (each weighed by its IDF in
  the tenant's corpus) that one window of ``PROXIMITY_WINDOW`` words of the chunk holds; a
  chunk that states the answer holds the question's terms together, one that mentions them
  in passing holds them apart;
* **exactness**: the share of the question's exact names (options such as ``--null`` or
  ``-0``, codes such as ``EAGAIN`` or ``CVE-2014-0160``, versions such as ``3.0.7``,
  identifiers such as ``FC_DEBUG`` or ``url.port``) written as such in the chunk or its
  section;

added to a term for its place in the fused ranking and one for its best place in either arm
(a chunk the encoder ranks first and BM25 does not find is fused 20th or later: its fused place
alone buries it under every chunk both arms rank moderately). A document's chunks take the
places its chunks held in the fused ranking, best first, so the order of documents does not
change.

Weights set on the real-document development set's tune half (answer chunk in the first 5,
formal questions 0.872 in fused order, 0.919 reordered; casual ones 0.737 → 0.763). Two more
signals were tried there and are not used: the section heading path (no change) and a name
at the start of a line, where an option list or a table defines it (0.919 → 0.892-0.912).
The arm place counts as the fused place does (the same curve, the same weight: nothing
fitted); what it moved on each half is in docs/evaluation-and-benchmarks.md.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

from shared.search.coverage import CorpusCounts, QueryTerms
from shared.stores.english_analysis import stemmed_words
from shared.stores.schemas import ArmHit, document_of_chunk

# Words of a chunk (stop words aside) that count as "together" for proximity: a sentence or
# two of a man page's option description.
PROXIMITY_WINDOW = 20
# The weights of the ordering key: the fused place, and the best place in either arm, each
# count as ``PLACE_K / (PLACE_K + i)`` (1 first, 0.5 eleventh), so a chunk holding all the
# question's terms together (proximity 1) outranks one ten places before it that holds them
# apart.
PLACE_K = 10
PROXIMITY_WEIGHT = 4.0
EXACT_WEIGHT = 1.0

# An exact name in a question: an option (-0, --null, -Olevel), a format letter (%M), or a word
# holding a digit, two capitals, a lower-to-upper change, an underscore or an inner dot
# (3.0.7, EAGAIN, workFactor, FC_DEBUG, url.port, CVE-2014-0160).
_EXACT = re.compile(
    r"(?<![\w%-])(--?[A-Za-z0-9][\w-]*|%[A-Za-z]|[\w./-]*(?:\d|[A-Z]{2,}|[a-z][A-Z]|_|\w\.\w)[\w./-]*)"
)


@dataclass(frozen=True)
class PassageMatch:
    """How a chunk's text answers a question: the shares of the question's weight held in
    one window (``proximity``) and anywhere (``held``), and of its exact names written in it
    or its section (``exact``); and, once placed, the chunk's best place in either arm
    (``arm_place``, 0 first)."""

    proximity: float
    held: float
    exact: float
    arm_place: int | None = None

    def key(self, place: int) -> float:
        """The ordering key of the chunk at ``place`` of the fused ranking (0 first)."""
        placed = place_weight(place)
        if self.arm_place is not None:  # None: placed by the fused ranking alone
            placed += place_weight(self.arm_place)
        return placed + PROXIMITY_WEIGHT * self.proximity + EXACT_WEIGHT * self.exact

    def with_arm_place(self, arm_place: int | None) -> PassageMatch:
        return dataclasses.replace(self, arm_place=arm_place)


def place_weight(place: int) -> float:
    """A place's term of the ordering key (``place`` 0 first): 1 first, 0.5 eleventh."""
    return PLACE_K / (PLACE_K + place)


def best_arm_places(
    hits: dict[str, list[ArmHit]], weights: dict[str, float] | None = None
) -> dict[str, int]:
    """Each chunk's best place (0 first) among the arms that returned it, an arm the fusion
    weighs 0 aside (it ranks nothing)."""
    places: dict[str, int] = {}
    for arm, arm_hits in hits.items():
        if weights is not None and not weights.get(arm, 1.0):
            continue
        for hit in arm_hits:
            places[hit.chunk_id] = min(places.get(hit.chunk_id, hit.rank - 1), hit.rank - 1)
    return places


@dataclass(frozen=True)
class ExactName:
    """One of a question's exact names and the pattern that finds it as a whole word:
    case-sensitive where its case says something (EAGAIN, workFactor), not for options and
    lowercase names."""

    name: str
    cased: bool
    pattern: re.Pattern[str]

    @classmethod
    def of(cls, name: str) -> ExactName:
        cased = bool(re.search(r"[A-Z]", name)) and not name.startswith("-")
        flags = 0 if cased else re.IGNORECASE
        return cls(name, cased, re.compile(r"(?<![\w-])" + re.escape(name) + r"(?!\w)", flags))

    def written_in(self, text: str) -> bool:
        # Most texts do not hold the name at all: a substring test rules them out at a
        # fraction of the pattern's cost (its look-behind is tried at every character): 0.64
        # -> 0.05 ms for a window of 26 SciFact abstracts and a question's names. For an
        # ASCII name only, where every letter the pattern matches without case folds to the
        # name's own (the Turkish dotted and dotless i aside: ``_folded``).
        if self.name.isascii():
            held = self.name in text if self.cased else self.name.casefold() in _folded(text)
            if not held:
                return False
        return self.pattern.search(text) is not None


@lru_cache(maxsize=4096)
def _folded(text: str) -> str:
    """``text`` case-folded, with the Turkish capital dotted I (which folds to "i" and a
    combining dot) and dotless i (which folds to itself) as "i": the pattern matches both
    with an "i" or an "I"."""
    return text.casefold().replace("i\u0307", "i").replace("\u0131", "i")


@dataclass(frozen=True)
class Question:
    """What a question's passages are compared with: its informative terms with their
    weights, and its exact names."""

    weights: dict[str, float]
    exact: tuple[ExactName, ...]

    @classmethod
    def of(cls, text: str, counts: CorpusCounts | None) -> Question:
        terms = QueryTerms.of(text)
        counts = counts or CorpusCounts.unknown()
        weights = {stem: max(counts.idf(stem), 0.0) for stem in terms.stems}
        return cls(weights, tuple(ExactName.of(name) for name in exact_names(text)))

    def match(self, text: str, section: str) -> PassageMatch:
        total = sum(self.weights.values())
        proximity = held = 0.0
        if total > 0:
            stems = _stems(text)
            proximity = _best_window(stems, self.weights) / total
            present = set(stems)
            held = sum(w for s, w in self.weights.items() if s in present) / total
        exact = self.names_written(text, section) / len(self.exact) if self.exact else 0.0
        return PassageMatch(round(proximity, 4), round(held, 4), round(exact, 4))

    def names_written(self, text: str, section: str) -> int:
        """How many of the question's exact names a chunk writes, in its text or section."""
        return sum(1 for n in self.exact if n.written_in(text) or n.written_in(section))


def exact_names(text: str) -> list[str]:
    """The exact names a question holds (see ``_EXACT``), each once."""
    names: list[str] = []
    for match in _EXACT.finditer(text):
        name = match.group()
        if not name.startswith("-"):
            name = name.strip(".-/")
        if len(name) >= 2 and name not in names:
            names.append(name)
    return names


@lru_cache(maxsize=4096)
def _stems(text: str) -> tuple[str, ...]:
    """A chunk's terms in order, kept per process for the chunks searches meet again (most of
    a tenant's searches meet its few long reference documents' chunks)."""
    return tuple(stemmed_words(text))


def _best_window(stems: tuple[str, ...], weights: dict[str, float]) -> float:
    """The most weight of distinct question terms within any ``PROXIMITY_WINDOW``
    consecutive terms of ``stems``: two pointers over the question terms' places only."""
    hits = [(place, stem) for place, stem in enumerate(stems) if stem in weights]
    inside: Counter[str] = Counter()
    weight = best = 0.0
    first = 0
    for place, stem in hits:
        while hits[first][0] <= place - PROXIMITY_WINDOW:
            gone = hits[first][1]
            inside[gone] -= 1
            if not inside[gone]:
                weight -= weights[gone]
            first += 1
        if not inside[stem]:
            weight += weights[stem]
        inside[stem] += 1
        best = max(best, weight)
    return best


def competing(window: list[str]) -> list[str]:
    """The chunks of ``window`` whose document has another chunk in it: the only ones whose
    order can change."""
    per_document = Counter(document_of_chunk(cid) for cid in window)
    return [cid for cid in window if per_document[document_of_chunk(cid)] > 1]


def reorder_within_documents(
    fused: list[tuple[str, float]], matches: dict[str, PassageMatch]
) -> list[tuple[str, float]]:
    """``fused`` with the chunks that have a match (the window) reordered within their
    document by :meth:`PassageMatch.key`: each document keeps the places its chunks held."""
    places: dict[str, list[int]] = {}
    for place, (chunk_id, _) in enumerate(fused):
        if chunk_id in matches:
            places.setdefault(document_of_chunk(chunk_id), []).append(place)
    reordered = list(fused)
    for held in places.values():
        best_first = sorted(held, key=lambda p: -matches[fused[p][0]].key(p))
        for place, source in zip(held, best_first, strict=True):
            reordered[place] = fused[source]
    return reordered
