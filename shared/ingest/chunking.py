"""Sentence-aware chunking bounded by the embedder's own tokenizer.

Chunks never straddle a section (heading) boundary, keep their character offsets into the
parsed text, and overlap by whole sentences up to ``overlap_tokens``. A sentence longer than
the budget is cut at token boundaries.

Chunks are bounded in characters too (``max_chars``): the tokenizer turns any word longer
than 100 characters into one unknown token, so a 200,000-character "word" would otherwise be
a one-token chunk, copied whole into both stores and every bulk request that carries it.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from shared.parsing import CODE, TABLE, ParsedDocument

_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])|\n\s*\n")

# Returns the character (start, end) offsets of every token of the text.
TokenOffsets = Callable[[str], Sequence[tuple[int, int]]]


@dataclass(frozen=True)
class TextChunk:
    ordinal: int
    text: str
    char_start: int
    char_end: int
    section: str
    token_count: int
    flags: tuple[str, ...] = ()  # from parsing: e.g. its page's text layer is doubtful
    # Tokens of its first sentence (first_sentence_end): the evidence policy tells from it
    # alone that a chunk cannot fit what is left of a token budget.
    first_sentence_tokens: int | None = None


# What a chunk is embedded as: the chunk alone, or after its document's title (and its
# section path): a chunk that says "it" and "the method" is found by what it is about.
ChunkContext = Literal["none", "title", "title_section"]


def contextual_text(
    text: str, title: str, section: str, context: ChunkContext, flags: tuple[str, ...] = ()
) -> str:
    """The text the encoder sees for a chunk (its stored text never changes). A table's rows
    are always seen under their section, which ends with the table's header row: a row of
    bare values ("7 | Wheezy | wheezy | 2013-05-04") says nothing of what its columns are,
    and a question names them ("when was wheezy released")."""
    table = TABLE in flags and bool(section.strip())
    if context == "none":
        return f"{section.strip()}\n\n{text}" if table else text
    lines = [title.strip()]
    if (context == "title_section" or table) and section.strip() != title.strip():
        lines.append(section.strip())
    heading = "\n".join(line for line in lines if line)
    return f"{heading}\n\n{text}" if heading else text


def sentence_spans(text: str, start: int, end: int) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    cursor = start
    for match in _SENTENCE_END.finditer(text, start, end):
        if match.start() > cursor:
            spans.append((cursor, match.start()))
        cursor = match.end()
    if cursor < end:
        spans.append((cursor, end))
    return [(s, e) for s, e in (_strip(text, s, e) for s, e in spans) if e > s]


def line_spans(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """The non-blank lines of ``text[start:end]``: a table's rows, each a whole unit."""
    spans = []
    for match in re.finditer(r"[^\n]+", text[start:end]):
        s, e = _strip(text, start + match.start(), start + match.end())
        if e > s:
            spans.append((s, e))
    return spans


def first_sentence_end(text: str) -> int | None:
    """Where the first of :func:`sentence_spans` ends (None for a text of no sentence),
    reading no further than that sentence."""
    cursor = 0
    for match in _SENTENCE_END.finditer(text):
        start, end = _strip(text, cursor, match.start())
        if end > start:
            return end
        cursor = match.end()
    start, end = _strip(text, cursor, len(text))
    return end if end > start else None


def _strip(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


class Chunker:
    def __init__(
        self,
        token_offsets: TokenOffsets,
        max_tokens: int,
        overlap_tokens: int,
        max_chars: int = 4000,
        min_tokens: int = 24,
    ) -> None:
        if max_tokens < 8:
            raise ValueError("max_tokens must be at least 8")
        if not 0 <= overlap_tokens < max_tokens // 2:
            raise ValueError("overlap_tokens must be >= 0 and below half of max_tokens")
        if max_chars < 100:
            raise ValueError("max_chars must be at least 100")
        self.token_offsets = token_offsets
        self.max_tokens = max_tokens
        self.overlap_tokens = overlap_tokens
        self.max_chars = max_chars
        self.min_tokens = min(min_tokens, max_tokens // 2)

    def chunk(self, doc: ParsedDocument) -> list[TextChunk]:
        text = doc.text
        token_starts = [s for s, _ in self.token_offsets(text)]

        def tokens_in(start: int, end: int) -> int:
            return bisect.bisect_left(token_starts, end) - bisect.bisect_left(token_starts, start)

        boundaries = sorted({0, *(s.start for s in doc.sections), len(text)})
        spans: list[tuple[int, int]] = []
        for region_start, region_end in itertools.pairwise(boundaries):
            # A table's rows and a code block's lines are its units: packed back together,
            # a block that fits is one chunk, and a longer one is cut only between lines.
            if {TABLE, CODE} & set(doc.flags_at(region_start)):
                units = line_spans(text, region_start, region_end)
            else:
                units = sentence_spans(text, region_start, region_end)
            sentences = self._fit_sentences(text, units, token_starts, tokens_in)
            spans += self._pack(sentences, tokens_in)
        chunks: list[TextChunk] = []
        for start, end in self._without_stubs(spans, doc, tokens_in):
            first = first_sentence_end(text[start:end])
            chunks.append(
                TextChunk(
                    ordinal=len(chunks),
                    text=text[start:end],
                    char_start=start,
                    char_end=end,
                    section=doc.section_at(start),
                    token_count=tokens_in(start, end),
                    flags=doc.flags_at(start),
                    first_sentence_tokens=None
                    if first is None
                    else tokens_in(start, start + first),
                )
            )
        return chunks

    def _without_stubs(
        self,
        spans: list[tuple[int, int]],
        doc: ParsedDocument,
        tokens_in: Callable[[int, int], int],
    ) -> list[tuple[int, int]]:
        """A chunk below ``min_tokens`` (a section of one line, the tail of a long one) is no
        answer on its own and crowds the results: it joins a neighbour where the two fit
        the budget, its own section's first (the chunk before, else the one after), else
        the next section's first chunk (a section that is one line, as a man page's NAME),
        never one whose parsing flags differ (a page with a doubtful text layer, a table; a
        code block is no such difference: a command's one-line description and its synopsis
        block belong together)."""

        def fits(start: int, end: int) -> bool:
            return tokens_in(start, end) <= self.max_tokens and end - start <= self.max_chars

        def alike(a: int, b: int) -> bool:  # a doubtful page, a table: never mixed with others
            return set(doc.flags_at(a)) - {CODE} == set(doc.flags_at(b)) - {CODE}

        merged: list[tuple[int, int]] = []
        i = 0
        while i < len(spans):
            start, end = spans[i]
            if tokens_in(start, end) >= self.min_tokens:
                merged.append((start, end))
                i += 1
                continue
            section = doc.section_at(start)
            before = merged[-1] if merged else None
            after = spans[i + 1] if i + 1 < len(spans) else None
            if before and doc.section_at(before[0]) == section and fits(before[0], end):
                merged[-1] = (before[0], max(before[1], end))
            elif after and alike(start, after[0]) and fits(start, after[1]):
                spans[i + 1] = (start, max(end, after[1]))  # goes on as the next one
            elif before and alike(before[0], start) and fits(before[0], end):
                merged[-1] = (before[0], max(before[1], end))
            else:
                merged.append((start, end))
            i += 1
        return merged

    def _fit_sentences(
        self,
        text: str,
        spans: list[tuple[int, int]],
        token_starts: list[int],
        tokens_in: Callable[[int, int], int],
    ) -> list[tuple[int, int]]:
        """Cut any sentence longer than the budget at token boundaries, then any piece still
        longer than ``max_chars`` at whitespace (or, within one long word, anywhere)."""
        return [
            piece
            for start, end in self._fit_tokens(text, spans, token_starts, tokens_in)
            for piece in self._fit_chars(text, start, end)
        ]

    def _fit_chars(self, text: str, start: int, end: int) -> list[tuple[int, int]]:
        pieces: list[tuple[int, int]] = []
        while end - start > self.max_chars:
            cut = start + self.max_chars
            space = text.rfind(" ", start + self.max_chars // 2, cut)
            cut = space if space > start else cut
            piece_start, piece_end = _strip(text, start, cut)
            if piece_end > piece_start:
                pieces.append((piece_start, piece_end))
            start = cut
        start, end = _strip(text, start, end)
        if end > start:
            pieces.append((start, end))
        return pieces

    def _fit_tokens(
        self,
        text: str,
        spans: list[tuple[int, int]],
        token_starts: list[int],
        tokens_in: Callable[[int, int], int],
    ) -> list[tuple[int, int]]:
        fitted: list[tuple[int, int]] = []
        for start, end in spans:
            if tokens_in(start, end) <= self.max_tokens:
                fitted.append((start, end))
                continue
            first = bisect.bisect_left(token_starts, start)
            last = bisect.bisect_left(token_starts, end)
            for i in range(first, last, self.max_tokens):
                piece_start = max(start, token_starts[i])
                j = i + self.max_tokens
                piece_end = token_starts[j] if j < last else end
                piece_start, piece_end = _strip(text, piece_start, piece_end)
                if piece_end > piece_start:
                    fitted.append((piece_start, piece_end))
        return fitted

    def _pack(
        self, sentences: list[tuple[int, int]], tokens_in: Callable[[int, int], int]
    ) -> list[tuple[int, int]]:
        packed: list[tuple[int, int]] = []
        firsts: list[int] = []  # each packed chunk's first sentence
        i = 0
        while i < len(sentences):
            start = sentences[i][0]
            j = i
            while (
                j + 1 < len(sentences)
                and tokens_in(start, sentences[j + 1][1]) <= self.max_tokens
                and sentences[j + 1][1] - start <= self.max_chars
            ):
                j += 1
            packed.append((start, sentences[j][1]))
            firsts.append(i)
            if j + 1 >= len(sentences):
                self._balance_tail(packed, firsts, sentences, tokens_in)
                break
            # Step back over whole sentences that fit in the overlap, but always move forward.
            k = j + 1
            while (
                k - 1 > i and tokens_in(sentences[k - 1][0], sentences[j][1]) <= self.overlap_tokens
            ):
                k -= 1
            i = k
        return packed

    def _balance_tail(
        self,
        packed: list[tuple[int, int]],
        firsts: list[int],
        sentences: list[tuple[int, int]],
        tokens_in: Callable[[int, int], int],
    ) -> None:
        """A region's last chunk below ``min_tokens`` (a long code block's closing lines, a
        section's last sentence) is no answer on its own, and the greedy chunk before it is
        too full to take it: the two share their sentences out evenly instead, each within
        the budget (the earlier chunks are left as they were)."""
        if len(packed) < 2 or tokens_in(*packed[-1]) >= self.min_tokens:
            return
        first, last = firsts[-2], len(sentences) - 1
        best: tuple[int, int] | None = None  # (larger half's tokens, split)
        for split in range(first + 1, last + 1):
            head = (sentences[first][0], sentences[split - 1][1])
            tail = (sentences[split][0], sentences[last][1])
            if any(
                tokens_in(*part) > self.max_tokens or part[1] - part[0] > self.max_chars
                for part in (head, tail)
            ):
                continue
            larger = max(tokens_in(*head), tokens_in(*tail))
            if best is None or larger < best[0]:
                best = (larger, split)
        if best is not None:
            split = best[1]
            packed[-2] = (sentences[first][0], sentences[split - 1][1])
            packed[-1] = (sentences[split][0], sentences[last][1])
