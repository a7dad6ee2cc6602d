"""Term coverage: does the tenant's corpus, and does the evidence found, hold what the
question asks about? The default decision's signal that needs no training data.

A question's *informative terms* are its words as BM25 matches them (lowercased, stemmed,
stop words dropped), without the words every question is made of ("what", "how", "does").
Each weighs its inverse document frequency in the tenant's own corpus, so a rare word counts
for more than a common one. Two figures come of them:

- the terms the tenant's corpus does not hold at all (``absent``): a question about
  "tungsten" over a corpus that never says it cannot be answered from it, however close its
  nearest chunk is in embedding space;
- ``covered``: the weight share of the informative terms that the first results (title,
  section and text) hold: evidence that speaks of every rare word of the question covers it.

Counting the corpus's documents per term is one Elasticsearch request (a ``filters``
aggregation within the tenant), made beside the query's encoding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shared.search.schemas import TermCoverage
from shared.stores.english_analysis import analyze, term_spans

# Words that say what kind of question it is, not what it is about.
QUESTION_WORDS = frozenset(
    {
        # asking
        "what", "which", "who", "whom", "whose", "when", "where", "why", "how", "whether",
        "do", "does", "did", "done", "doing", "can", "could", "should", "would", "may",
        "might", "must", "shall", "am", "were", "been", "being", "have", "has", "had",
        # the asker and the people around
        "i", "me", "my", "mine", "myself", "we", "us", "our", "you", "your", "he", "she",
        "his", "her", "its", "them", "someone", "somebody", "anyone", "anybody", "everyone",
        "nobody", "people",
        # verbs and words any question is made of
        "get", "gets", "got", "give", "gives", "given", "make", "makes", "made", "put",
        "keep", "keeps", "let", "lets", "tell", "told", "say", "says", "said", "know",
        "want", "need", "needs", "use", "used", "using", "happen", "happens", "mean",
        "means", "way", "ways", "thing", "things", "something", "anything", "nothing",
        "kind", "type", "here", "there", "than", "so", "any", "some", "all", "about", "from",
        "up", "out", "also", "only", "other", "else", "each", "every", "both", "either",
        "like", "instead", "actually", "really", "still", "usually", "ever", "already",
        "just", "even", "much", "many", "very", "s", "t",
    }
)  # fmt: skip
# Contractions ("I've", "doesn't") are question words when what they contract is one.
_CONTRACTED = QUESTION_WORDS | {
    "don", "doesn", "didn", "isn", "aren", "wasn", "weren", "won", "can", "shouldn",
    "wouldn", "couldn", "haven", "hasn", "it", "that", "what", "there",
}  # fmt: skip
# The first results whose words count as the evidence found.
EVIDENCE_RESULTS = 3


@dataclass(frozen=True)
class QueryTerms:
    """The informative terms of a question, each with a word of the question it stands for."""

    stems: tuple[str, ...]
    words: dict[str, str]

    @classmethod
    def of(cls, question: str) -> QueryTerms:
        stems: list[str] = []
        words: dict[str, str] = {}
        for start, end, stem in term_spans(question):
            word = question[start:end]
            if _asking(word.lower()) or stem in words:
                continue
            stems.append(stem)
            words[stem] = word
        return cls(tuple(stems), words)


def _asking(word: str) -> bool:
    if word in QUESTION_WORDS:
        return True
    head, apostrophe, _ = word.replace("\u2019", "'").partition("'")
    return bool(apostrophe) and head in _CONTRACTED


@dataclass(frozen=True)
class CorpusCounts:
    """The tenant's number of chunks, and how many hold each term."""

    chunks: int
    holding: dict[str, int]
    known: bool = True  # False: Elasticsearch could not count (every term weighs the same)

    @classmethod
    def unknown(cls) -> CorpusCounts:
        """What the decision reads when the counts could not be had (an index whose shard is
        still starting, Elasticsearch down): no term is known absent, each weighs the same,
        and the evidence's share of them still decides."""
        return cls(0, {}, known=False)

    def idf(self, stem: str) -> float:
        if not self.known:
            return 1.0
        df = self.holding.get(stem, 0)
        return math.log(1 + (self.chunks - df + 0.5) / (df + 0.5))


def coverage(terms: QueryTerms, counts: CorpusCounts, evidence: list[str]) -> TermCoverage:
    """How far the corpus and ``evidence`` (the first results' texts) hold ``terms``."""
    held = set(analyze(" ".join(evidence[:EVIDENCE_RESULTS])).split())
    # A term of the evidence is in the corpus, whatever the counts say: Elasticsearch may
    # not hold a chunk Postgres has just committed (the relay's lag) and the dense arm found.
    missing = [
        s for s in terms.stems if counts.known and counts.holding.get(s, 0) == 0 and s not in held
    ]
    # A common English word the corpus never uses is the asker's wording, not its topic
    # ("how do bees *show* where flowers are" of a text that says "tell"): it says nothing
    # either way. A rare one ("tungsten", "jobserver") names what the corpus lacks.
    stems = [s for s in terms.stems if s not in missing or not common_word(terms.words[s])]
    result = TermCoverage(terms=[terms.words[s] for s in stems])
    if not stems:
        return result
    weights = {s: counts.idf(s) for s in stems}
    total = sum(weights.values()) or 1.0
    absent = [s for s in stems if s in missing]
    result.absent = [terms.words[s] for s in absent]
    result.absent_weight = round(sum(weights[s] for s in absent) / total, 4)
    result.uncovered = [terms.words[s] for s in stems if s not in held and s not in absent]
    result.covered = round(sum(w for s, w in weights.items() if s in held) / total, 4)
    return result


# Words at least this frequent in English (Zipf scale: 4 is once in 100,000 words, "laptop",
# "battery"; "tungsten" is 3.1, "xpath" 1.9) are common words (wordfreq's English list, which
# ships inside its PyPI package).
COMMON_ZIPF = 4.0


def common_word(word: str) -> bool:
    from wordfreq import zipf_frequency

    return bool(zipf_frequency(word, "en") >= COMMON_ZIPF)
