"""The default decision's term coverage (shared/search/coverage.py) and what the policy does
with it: terms the corpus holds nowhere abstain with those terms named, evidence that holds
too little of the question abstains, part of it asks to verify."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shared.search.coverage import CorpusCounts, QueryTerms, coverage, is_name
from shared.search.policy import apply_policy
from shared.search.values import PolicyConfig
from tests.unit.search.test_diversify import _candidates


class Words:
    def __call__(self, text: str) -> int:
        return len(text.split())

    def prefix_counts(self, text: str, ends: list[int]) -> list[int]:
        return [len(text[:e].split()) for e in ends]


def test_question_words_are_not_informative_and_each_term_keeps_its_word() -> None:
    terms = QueryTerms.of("What is the boiling point of Tungsten? How does tungsten boil?")
    assert terms.stems == ("boil", "point", "tungsten")
    assert terms.words == {"boil": "boiling", "point": "point", "tungsten": "Tungsten"}
    assert QueryTerms.of("what is it and how").stems == ()


def test_absent_terms_and_coverage_are_weighed_by_the_corpus_rarity() -> None:
    counts = CorpusCounts(1000, {"kettl": 3, "boil": 40, "water": 400, "point": 50})
    kettle = QueryTerms.of("do kettles boil water")
    full = coverage(kettle, counts, ["The kettle boils water quickly."])
    assert full.absent == [] and full.uncovered == [] and full.covered == 1.0
    # water is common: evidence without it still holds most of the question's weight
    most = coverage(kettle, counts, ["A kettle may boil over."])
    assert most.uncovered == ["water"] and 0.75 < most.covered < 1.0
    # the rare word missing: most of the weight is missing
    rare = coverage(kettle, counts, ["Water boils at 100 degrees."])
    assert rare.uncovered == ["kettles"] and rare.covered < 0.6
    tungsten = coverage(QueryTerms.of("boiling point of tungsten"), counts, ["Boil water."])
    assert tungsten.absent == ["tungsten"] and tungsten.absent_weight > 0.4
    assert tungsten.uncovered == ["point"]  # "boiling" is held by the evidence
    # "tungsten" is an English word: wording it may be, so it weighs as evidence not found
    # (no more than the rarest word the corpus holds), not as a name the corpus lacks
    assert tungsten.absent_names_weight == 0.0 and tungsten.covered < 0.5


def test_each_document_of_the_evidence_is_weighed_on_its_own() -> None:
    """Three results of three documents, each holding one word of the question, cover most
    of it together; no one of them holds more than its own word's share."""
    counts = CorpusCounts(1000, {"kubectl": 2, "log": 30, "pod": 5, "crash": 20})
    question = QueryTerms.of("kubectl logs for a pod that already crashed")
    texts = ["Use kubectl to list them.", "Errors go to the log.", "If it crashes, report it."]
    scattered = coverage(question, counts, texts, documents=["hosts", "events", "wget"])
    assert scattered.covered > 0.6 and scattered.documents == 3
    assert 0 < scattered.document_covered < 0.4
    one = coverage(question, counts, texts, documents=["manual", "manual", "manual"])
    assert one.documents == 1 and one.document_covered == one.covered
    two = coverage(question, counts, texts, documents=["hosts", "other", "hosts"])
    assert two.documents == 2 and scattered.document_covered < two.document_covered < one.covered
    # without documents the evidence counts as one document's
    unknown = coverage(question, counts, texts)
    assert unknown.documents == 1 and unknown.document_covered == unknown.covered


def test_unknown_counts_weigh_every_term_alike_and_name_none_absent() -> None:
    """Elasticsearch could not count (a new index's shard still starting): the evidence's
    share of the question still decides; no word is called absent."""
    unknown = coverage(QueryTerms.of("boiling point of tungsten"), CorpusCounts.unknown(), [
        "Kettles boil water."
    ])  # fmt: skip
    assert unknown.absent == [] and unknown.absent_weight == 0.0
    assert unknown.uncovered == ["point", "tungsten"]
    # "point" is an everyday word (specificity 0.2 against 1 for "boiling" and "tungsten")
    assert unknown.covered == round(1 / 2.2, 4)


def test_everyday_words_weigh_little_and_names_the_corpus_lacks_decide() -> None:
    """Casual wording: "squash" and "stuff" (English words, one never in the corpus) weigh
    less than what the question is about; "jobserver" (no English word) is a name the corpus
    lacks, and weighs as one."""
    counts = CorpusCounts(
        1000, {"gzip": 20, "level": 60, "compress": 30, "stuff": 5, "ninja": 40, "make": 90}
    )
    casual = coverage(
        QueryTerms.of("what level does gzip squash stuff at"),
        counts,
        ["gzip compresses at level 6 by default"],
    )
    assert casual.absent == ["squash"] and casual.absent_names_weight == 0.0
    assert casual.uncovered == ["stuff"] and casual.covered >= 0.4
    name = coverage(
        QueryTerms.of("does ninja work with the make jobserver"), counts, ["ninja runs make"]
    )
    assert name.absent == ["work", "jobserver"] and name.absent_names_weight >= 0.25


def test_a_rare_form_of_an_english_word_is_wording_not_a_name() -> None:
    """wordfreq counts each form of a word apart: "nags" is rarer than names are (zipf 2.4),
    "nag" is not (3.2). An inflected English word the corpus lacks is the asker's wording; a
    word no form of which English uses ("bitfields") stays a name."""
    assert not is_name("nags", "nag") and not is_name("bike's", "bike")
    assert is_name("nags")  # the surface form alone reads as a name
    assert is_name("bitfields", "bitfield") and is_name("gpl3", "gpl3")
    # a form English does not write is no inflection, whatever its stem: the Polars library
    assert is_name("polars", "polar") and is_name("cgroups", "cgroup")
    counts = CorpusCounts(1000, {"npm": 80, "unknown": 9, "config": 40, "key": 30})
    casual = coverage(
        QueryTerms.of("npm suddenly nags about unknown config keys"),
        counts,
        ["npm warns when unknown configuration keys are defined"],
    )
    assert "nags" in casual.absent and "nags" in casual.wording
    assert casual.absent_names_weight == 0.0


def test_what_a_question_asks_for_must_be_stated() -> None:
    counts = CorpusCounts(100, {"tar": 10, "block": 3, "factor": 3, "diffutil": 5})
    question = "What is GNU tar's default blocking factor?"
    mentioned = coverage(
        QueryTerms.of(question),
        counts,
        ["-b, --blocking-factor=BLOCKS  BLOCKS x 512 bytes per record"],
        question,
    )
    assert mentioned.unstated == ["default"]
    stated = coverage(
        QueryTerms.of(question), counts, ["The default blocking factor is 20."], question
    )
    assert stated.unstated == []
    release = "What changed in diffutils 3.10?"
    other = coverage(QueryTerms.of(release), counts, ["Noteworthy changes in release 3.9"], release)
    assert other.unstated == ["3.10"]


def _policy_result(
    covered: float,
    absent_weight: float = 0.0,
    terms: tuple[str, ...] = ("x",),
    uncovered: tuple[str, ...] = (),
    unstated: tuple[str, ...] = (),
    documents: int = 1,
    document_covered: float | None = None,
    results_spread: bool = False,
) -> Any:
    from shared.search.schemas import TermCoverage

    candidates = []
    for c in _candidates(4, documents=4):
        text = "Kettles boil water."
        c = replace(c, external_id=c.document_id, text=text, char_end=len(text), token_count=3)
        c.scores["dense_cosine"] = 0.9
        candidates.append(c)
    config = PolicyConfig(
        "dense_cosine",
        0.3,
        100,
        3,
        0.99,
        coverage=TermCoverage(
            terms=list(terms),
            uncovered=list(uncovered),
            covered=covered,
            absent_weight=absent_weight,
            absent_names_weight=absent_weight,
            unstated=list(unstated),
            documents=documents,
            document_covered=covered if document_covered is None else document_covered,
        ),
        results_spread=results_spread,
    )
    return apply_policy(candidates, config, Words())


def test_the_policy_answers_verifies_or_abstains_by_coverage() -> None:
    answered = _policy_result(covered=0.9)
    assert answered.status == "answerable" and answered.evidence
    assert answered.decision().coverage is not None
    partial = _policy_result(covered=0.3)
    assert (partial.status, partial.reason) == ("verify", "partial_coverage") and partial.evidence
    thin = _policy_result(covered=0.1)
    assert (thin.status, thin.reason) == ("abstain", "evidence_does_not_cover_query")
    assert thin.evidence == [] and thin.tokens_used == 0
    assert set(thin.per_result.values()) == {"evidence_does_not_cover_query"}
    absent = _policy_result(covered=0.9, absent_weight=0.5)
    assert (absent.status, absent.reason) == ("abstain", "query_terms_absent")
    assert absent.evidence == []


def test_one_word_in_common_is_no_coverage_and_an_unstated_default_asks_to_verify() -> None:
    """An off-topic question that shares one word with a page ("what's the best tar to seal
    a flat roof" of tar's manual) abstains, however rare that word; evidence about a
    question's subject that states no default asks to verify."""
    one = _policy_result(
        covered=0.6, terms=("tar", "seal", "flat", "roof"), uncovered=("seal", "flat", "roof")
    )
    assert (one.status, one.reason) == ("abstain", "evidence_does_not_cover_query")
    unstated = _policy_result(covered=0.9, unstated=("default",))
    assert (unstated.status, unstated.reason) == ("verify", "answer_not_stated")
    assert unstated.evidence


def test_evidence_scattered_over_documents_none_of_which_answers_abstains() -> None:
    """Each first result of another document, none holding what an answer needs
    (``coverage_answer``, 0.6 in this config): no document is about the question, though
    together they hold most of it. The same coverage from one document, or from three of
    which one holds enough, answers; so does a request that spreads its results itself."""
    scattered = _policy_result(covered=0.9, documents=3, document_covered=0.3)
    assert (scattered.status, scattered.reason) == ("abstain", "evidence_does_not_cover_query")
    assert scattered.evidence == []
    # an absent word among what is missing does not make it a question of absent terms
    absent = _policy_result(covered=0.8, absent_weight=0.1, documents=3, document_covered=0.3)
    assert (absent.status, absent.reason) == ("abstain", "evidence_does_not_cover_query")
    one_answers = _policy_result(covered=0.9, documents=3, document_covered=0.7)
    assert one_answers.status == "answerable"
    two_documents = _policy_result(covered=0.9, documents=2, document_covered=0.3)
    assert two_documents.status == "answerable"
    spread = _policy_result(covered=0.9, documents=3, document_covered=0.3, results_spread=True)
    assert spread.status == "answerable"
