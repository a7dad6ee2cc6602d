"""Term coverage: does the tenant's corpus, and does the evidence found, hold what the
question asks about? The default decision's signal that needs no training data.

A question's *informative terms* are its words as BM25 matches them (lowercased, stemmed,
stop words dropped), without the words every question is made of ("what", "how", "does").
Each weighs its inverse document frequency in the tenant's own corpus, so a rare word counts
for more than a common one. Three figures come of them:

- the terms the tenant's corpus does not hold at all (``absent``): a question about
  "tungsten" over a corpus that never says it cannot be answered from it, however close its
  nearest chunk is in embedding space;
- ``covered``: the weight share of the informative terms that the first results (title,
  section and text) hold: evidence that speaks of every rare word of the question covers it;
- ``document_covered``: the largest share that one document's first results hold: evidence
  of three documents each holding a word or two of the question covers none of it.

Counting the corpus's documents per term is one Elasticsearch request (a ``filters``
aggregation within the tenant), made beside the query's encoding.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache

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
# A preposition (then perhaps a determiner) just before a word: it names a thing.
_AFTER_PREPOSITION = re.compile(
    r"\b(of|about|for|on|in|with|from|into|without|between|against)\s+"
    r"((the|a|an|my|your|our|their|its|this|that|these|those|some)\s+)?$",
    re.IGNORECASE,
)
# The first results whose words count as the evidence found.
EVIDENCE_RESULTS = 3


@dataclass(frozen=True)
class QueryTerms:
    """The informative terms of a question, each with a word of the question it stands for."""

    stems: tuple[str, ...]
    words: dict[str, str]
    # The terms that name what is asked about, as far as word order tells without a parser:
    # the question's last informative word ("the boiling point of *tungsten*"), and a word
    # right after a preposition ("a backup *for* my *laptop*"). The others are the words
    # around it ("how often must I feed my bread yeast culture": "yeast" is wording).
    subjects: frozenset[str] = frozenset()

    @classmethod
    def of(cls, question: str) -> QueryTerms:
        stems: list[str] = []
        words: dict[str, str] = {}
        subjects: set[str] = set()
        for start, end, stem in term_spans(question):
            word = question[start:end]
            if _asking(word.lower()) or stem in words:
                continue
            stems.append(stem)
            words[stem] = word
            if _AFTER_PREPOSITION.search(question[:start]):
                subjects.add(stem)
        if stems:
            subjects.add(stems[-1])
        return cls(tuple(stems), words, frozenset(subjects))


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


def coverage(
    terms: QueryTerms,
    counts: CorpusCounts,
    evidence: list[str],
    question: str = "",
    documents: list[str] | None = None,
) -> TermCoverage:
    """How far the corpus and ``evidence`` (the first results' texts, of ``documents``: each
    text's document, where known) hold ``terms``, and what ``question`` asks for that the
    evidence does not state.

    Each term weighs its IDF in the tenant's corpus times its *specificity*: a word people
    use every day ("stuff", "box", "going") says less about what is asked than a rare one
    ("blocking", "jemalloc"), and is the first to be said another way in a casual question
    ("what level does gzip squash stuff at"). Of the terms the corpus holds nowhere,
    *names* (no English word nor a rare form of one: "jobserver", "EINTEGRITY", "gpl3", or
    written as an identifier) are what the corpus lacks; an English word the corpus never
    uses ("yeast" for a text that says "sourdough starter", "nuke" for "delete") may be the
    asker's wording, so it counts as evidence not found, weighed like any other term, and the
    rest of the question decides.

    Each document among the evidence is weighed on its own as well (``document_covered``):
    evidence of three documents that each hold a word or two of the question ("kubectl logs
    for a pod that already crashed" of an events page, wget's bug list and man-db's news)
    covers it together, while none of them is about it."""
    texts = evidence[:EVIDENCE_RESULTS]
    held_by_text = [set(analyze(text).split()) for text in texts]
    held = set().union(*held_by_text)
    # Documents unknown, the evidence counts as one document's.
    of_texts = documents[: len(texts)] if documents else [""] * len(texts)
    held_by_document: dict[str, set[str]] = {}
    for document, text_terms in zip(of_texts, held_by_text, strict=True):
        held_by_document.setdefault(document, set()).update(text_terms)
    # A term of the evidence is in the corpus, whatever the counts say: Elasticsearch may
    # not hold a chunk Postgres has just committed (the relay's lag) and the dense arm found.
    missing = [
        s for s in terms.stems if counts.known and counts.holding.get(s, 0) == 0 and s not in held
    ]
    stems = list(terms.stems)
    result = TermCoverage(terms=[terms.words[s] for s in stems], documents=len(held_by_document))
    if not stems:
        return result
    absent = [s for s in stems if s in missing]
    names = [s for s in absent if is_name(terms.words[s], s)]
    weights = {s: counts.idf(s) * specificity(terms.words[s], s) for s in stems}
    # An English word the corpus never uses is wording where it is not what the question
    # is about: it weighs nothing.
    for s in absent:
        if s not in names and s not in terms.subjects:
            weights[s] = 0.0
    result.wording = [terms.words[s] for s in absent if not weights[s] and s not in names]
    total = sum(weights.values()) or 1.0
    result.absent = [terms.words[s] for s in absent]
    result.absent_weight = round(sum(weights[s] for s in absent) / total, 4)
    result.absent_names_weight = round(sum(weights[s] for s in names) / total, 4)
    result.uncovered = [terms.words[s] for s in stems if s not in held and s not in absent]

    def share(held_terms: set[str]) -> float:
        return round(sum(w for s, w in weights.items() if s in held_terms) / total, 4)

    result.covered = share(held)
    result.document_covered = max(map(share, held_by_document.values()), default=0.0)
    result.unstated = unstated(question, " ".join(texts), held)
    return result


# Words at least this frequent in English (Zipf scale: 4 is once in 100,000 words, "laptop",
# "battery"; "tungsten" is 3.1, "xpath" 1.9) are common words (wordfreq's English list, which
# ships inside its PyPI package).
COMMON_ZIPF = 4.0
# A term's specificity: 1 up to COMMON_ZIPF, falling linearly to EVERYDAY_SPECIFICITY at
# EVERYDAY_ZIPF ("stuff" 5.1, "going" 5.9) and below; names keep 1.
EVERYDAY_ZIPF = 5.0
EVERYDAY_SPECIFICITY = 0.2
# Below this a word is no English word people write (wordfreq's English list: "jobserver"
# 0, "emscripten" 0, "ppk" 1.1; against "zap" 2.96, "nuke" 3.3, "yeast" 3.6, "tungsten" 3.1),
# unless it is a rare form of one ("nags" 2.41 of "nag" 3.18). A form rarer than
# INFLECTED_FORM_ZIPF is not taken for one, whatever its stem: "polars" (1.39, the library)
# stems to "polar" (3.96), "cgroups" (1.03) to "cgroup".
NAME_ZIPF = 2.5
INFLECTED_FORM_ZIPF = 2.0
_NAME_SHAPE = re.compile(r"\d|_|.[A-Z]")


@lru_cache(maxsize=8192)
def zipf(word: str) -> float:
    from wordfreq import zipf_frequency

    return float(zipf_frequency(word, "en"))


def common_word(word: str) -> bool:
    return zipf(word) >= COMMON_ZIPF


def is_name(word: str, stem: str = "") -> bool:
    """A word no English word list knows, or written as an identifier (a digit, an
    underscore, a capital after its first letter: "gpl3", "FC_DEBUG", "EINTEGRITY").
    A rare form of an English word is no name ("nags" of "nag", "bike's" of "bike"): the
    list counts each form apart. ``stem`` is the word's term as the analyzer stems it."""
    if _NAME_SHAPE.search(word):
        return True
    z = zipf(word)
    if z >= NAME_ZIPF:
        return False
    return not stem or z < INFLECTED_FORM_ZIPF or zipf(stem) < NAME_ZIPF


def specificity(word: str, stem: str = "") -> float:
    """How much ``word`` says about what is asked (1 for a name or a rare word, down to
    EVERYDAY_SPECIFICITY for an everyday one), by how often its written form occurs;
    ``stem`` (its analyzed term) tells a rare form of a word from a name (``is_name``)."""
    if is_name(word, stem):
        return 1.0
    z = zipf(word)
    if z <= COMMON_ZIPF:
        return 1.0
    fall = (z - COMMON_ZIPF) / (EVERYDAY_ZIPF - COMMON_ZIPF)
    return max(EVERYDAY_SPECIFICITY, 1.0 - fall * (1.0 - EVERYDAY_SPECIFICITY))


# What a question may ask for that evidence about its subject need not state: a default, a
# version, or an exact version-like name. Evidence that states none of it is evidence about
# the subject, not the answer ("What is GNU tar's default blocking factor?" of a man page
# that gives the factor's option but no default).
_ASKS_DEFAULT = re.compile(r"\bdefaults?\b", re.IGNORECASE)
_ASKS_VERSION = re.compile(
    r"\b(which|what) (\w+ )?(version|release)\b|\bsince (when|which)\b", re.IGNORECASE
)
_VERSION = re.compile(r"\b\d+\.\d+")
_VERSION_NAME = re.compile(r"\d+(\.\d+)+")


def unstated(question: str, evidence: str, held: set[str]) -> list[str]:
    """What ``question`` asks for that ``evidence`` (whose analyzed terms are ``held``) does
    not state: ``default``, ``version``, or a version it names ("3.10")."""
    missing = []
    if _ASKS_DEFAULT.search(question) and "default" not in held:
        missing.append("default")
    if _ASKS_VERSION.search(question) and not _VERSION.search(evidence):
        missing.append("version")
    for match in _VERSION_NAME.finditer(question):
        version = match.group()
        if "." in version and not re.search(rf"(?<![\w.]){re.escape(version)}(?![\w])", evidence):
            missing.append(version)
    return missing
