"""Passage ordering within a document (shared/search/passages.py): the chunk that holds the
question's terms together, writes its exact names and defines them comes before the chunks
that mention them in passing; documents keep their places."""

from __future__ import annotations

import random

from shared.search.coverage import CorpusCounts
from shared.search.passages import (
    PROXIMITY_WINDOW,
    ExactName,
    PassageMatch,
    Question,
    _best_window,
    best_arm_places,
    competing,
    exact_names,
    reorder_within_documents,
)
from shared.stores.schemas import ArmHit

# From xargs(1): the synopsis lists every option; the option list defines --null.
SYNOPSIS = (
    "xargs [options] [command [initial-arguments]]\n"
    "xargs reads items from the standard input, delimited by blanks (which can be protected "
    "with double or single quotes or a backslash) or newlines, and executes the command one "
    "or more times with any initial-arguments followed by items read from standard input. "
    "Because Unix filenames can contain blanks and newlines, this default behaviour is often "
    "problematic; filenames containing blanks and/or newlines are incorrectly processed by "
    "xargs. In these situations it is better to use the -0 option."
)
NULL_OPTION = (
    "-0, --null\n"
    "       Input items are terminated by a null character instead of by whitespace, and the "
    "quotes and backslash are not special (every character is taken literally). Disables "
    "the end of file string, which is treated like any other argument."
)
OTHER_OPTION = (
    "-a file, --arg-file=file\n"
    "       Read items from file instead of standard input. If you use this option, stdin "
    "remains unchanged when commands are run."
)
COUNTS = CorpusCounts(
    500, {"input": 40, "item": 30, "termin": 8, "null": 5, "charact": 20, "xarg": 25}
)


def test_the_exact_names_of_a_question() -> None:
    assert exact_names("What does xargs -0 do, and --null?") == ["-0", "--null"]
    assert exact_names("Which OpenSSL release fixed CVE-2014-0160 (Heartbleed)?") == [
        "OpenSSL",
        "CVE-2014-0160",
    ]
    assert exact_names("What does EAGAIN mean in 3.0.7, url.port and FC_DEBUG?") == [
        "EAGAIN",
        "3.0.7",
        "url.port",
        "FC_DEBUG",
    ]
    assert exact_names("what does %M report in GNU time") == ["%M", "GNU"]
    assert exact_names("how do i compress a folder") == []


def test_the_chunk_that_states_the_option_beats_the_one_that_mentions_it_in_passing() -> None:
    question = Question.of("What does xargs --null do with input items?", COUNTS)
    defines = question.match(NULL_OPTION, "OPTIONS")
    mentions = question.match(SYNOPSIS, "DESCRIPTION")
    assert defines.exact == 1.0
    assert mentions.exact == 0.0
    assert defines.proximity > mentions.proximity
    # the defining chunk moves up from the third place of its document's
    assert defines.key(2) > mentions.key(0)


def test_a_chunk_of_the_question_words_apart_holds_less_than_one_of_them_together() -> None:
    question = Question.of("which character terminates input items", COUNTS)
    together = question.match("Input items are terminated by a null character.", "")
    filler = " ".join(["word"] * PROXIMITY_WINDOW)
    apart = question.match(f"Input {filler} items {filler} terminated {filler} character", "")
    assert together.proximity == 1.0 == apart.held
    assert apart.proximity < 0.5


def test_documents_keep_their_places_and_only_their_own_chunks_move() -> None:
    fused = [("a:0", 0.9), ("b:0", 0.8), ("a:1", 0.7), ("c:0", 0.6), ("a:2", 0.5)]
    question = Question.of("What does xargs --null do with input items?", COUNTS)
    matches = {
        "a:0": question.match(SYNOPSIS, "DESCRIPTION"),
        "a:1": question.match(OTHER_OPTION, "OPTIONS"),
        "a:2": question.match(NULL_OPTION, "OPTIONS"),
    }
    assert competing([cid for cid, _ in fused]) == ["a:0", "a:1", "a:2"]
    reordered = reorder_within_documents(fused, matches)
    assert [cid for cid, _ in reordered] == ["a:2", "b:0", "a:0", "c:0", "a:1"]
    # a chunk that was not read (gone since) keeps its place
    assert reorder_within_documents(fused, {}) == fused


def test_a_chunk_one_arm_ranks_first_is_not_buried_by_its_fused_place() -> None:
    """The encoder's first hit that BM25 does not return is fused behind every chunk both
    arms rank moderately (libtasn1's asn1_check_version, 26th); its best arm place counts too,
    so it comes before a chunk fused just ahead of it that holds the question no better."""
    fused = [("a:0", 0.04), ("a:1", 0.039), *((f"x:{i}", 0.03) for i in range(4)), ("a:2", 0.016)]
    hits = {
        "lexical": [ArmHit("a:0", 1, 9.0), ArmHit("a:1", 4, 7.0)],
        "dense": [ArmHit("a:2", 1, 0.61), ArmHit("a:0", 6, 0.5), ArmHit("a:1", 5, 0.52)],
    }
    assert best_arm_places(hits) == {"a:0": 0, "a:1": 3, "a:2": 0}
    # an arm the fusion weighs 0 ranks nothing
    assert best_arm_places(hits, {"dense": 0.0, "lexical": 1.3}) == {"a:0": 0, "a:1": 3}
    held = PassageMatch(proximity=0.3, held=0.3, exact=0.0)
    matches = {"a:0": held, "a:1": held, "a:2": PassageMatch(0.35, 0.35, 0.0)}
    # by fused place alone, the dense arm's first stays last of its document
    assert [c for c, _ in reorder_within_documents(fused, matches)][-1] == "a:2"
    places = best_arm_places(hits)
    placed = {cid: match.with_arm_place(places[cid]) for cid, match in matches.items()}
    assert [c for c, _ in reorder_within_documents(fused, placed)] == [
        "a:0",
        "a:2",
        *(f"x:{i}" for i in range(4)),
        "a:1",
    ]


def test_the_best_window_is_the_best_of_every_window() -> None:
    def naive(stems: tuple[str, ...], weights: dict[str, float]) -> float:
        windows = (stems[i : i + PROXIMITY_WINDOW] for i in range(len(stems)))
        return max((sum(weights[s] for s in set(w) if s in weights) for w in windows), default=0)

    rng = random.Random(7)
    for _ in range(500):
        stems = tuple(rng.choice("abcdefgh") for _ in range(rng.randint(0, 70)))
        weights = {s: rng.random() for s in rng.sample("abcdefgh", 3)}
        assert abs(_best_window(stems, weights) - naive(stems, weights)) < 1e-9


def test_an_exact_name_is_found_as_its_pattern_finds_it() -> None:
    texts = [
        "-S, --buffer-size=SIZE  use SIZE",  # the option, followed by "="
        "--buffer-sizes is another option",  # the name's start is no name
        "see also: buffer size",  # the words, not the name
        "EAGAIN: try again",
        "eagain in lower case",  # a cased name: its case counts
        "GETADDRINFO failed with ENOTFOUND",
        "Temperatures in \u212a (kelvin) and \u017fs",  # letters that fold to ASCII ones
        "url.port = 8080",
        "F\u0130LE_S\u0130ZE and f\u0131le_s\u0131ze",  # Turkish dotted and dotless i
        "",
    ]
    names = ["--buffer-size", "EAGAIN", "getaddrinfo", "url.port", "k", "ss", "0x80", "file_size"]
    for name in names:
        exact = ExactName.of(name)
        for text in texts:
            assert exact.written_in(text) == bool(exact.pattern.search(text)), (name, text)
    assert ExactName.of("--buffer-size").written_in(texts[0])
    assert not ExactName.of("--buffer-size").written_in(texts[1])
    assert not ExactName.of("EAGAIN").written_in(texts[4])
    assert ExactName.of("getaddrinfo").written_in(texts[5])
    assert ExactName.of("file_size").written_in(texts[8])
