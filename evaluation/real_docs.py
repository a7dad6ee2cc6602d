"""``concord eval-docs``: a set of real documents and questions about them (files/ and
questions.jsonl, as in evaluation/devsets/real-docs) through the real ingest pipeline and the
default search request, measuring what a user of the answers sees:

- answerable questions: how often the chunk that holds the answer (its evidence span) is in
  the first 5 results (and first), how often its file is among the first 5, the file's mean
  reciprocal rank in the first 10 (MRR@10), how often the decision is ``answerable``, and
  these per format (the gold file's extension);
- near-topic and off-topic questions (answers the corpus does not hold): how often the
  decision abstains (and how often it asks to verify);
- the first 5 results of every question: the share that are noise (a heading alone, a
  navigation bar, a table of contents: ``is_noise``), the share that are short (fewer than
  ``STUB_WORDS`` words: a table row or a one-line description may be an answer, but many
  are crumbs) and the share that repeat a result above them.

A set's documents are its files, each uploaded under its file name with the content type its
name and bytes give (as ``concord ingest`` does).

Each question belongs to a ``split``: ``tune`` (what thresholds and weights may be fitted on)
or ``test`` (never fitted on: a change counts when the test half moves), and has a ``style``:
``formal`` or ``casual`` (everyday words for what a formal question asks, with its file and
evidence). The figures are given for the whole set and for each split; within each,
answerable figures are of the formal questions, ``casual_*`` of the casual ones."""

from __future__ import annotations

import dataclasses
import difflib
import json
import random
import re
import statistics
import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evaluation.corpus import Progress, sync_uploads
from evaluation.metrics import nearest_rank
from shared.db import unit_of_work
from shared.documents.schemas import Upload
from shared.documents.sync import file_upload
from shared.search.calibration import calibrate
from shared.search.schemas import SearchRequest, SearchResult
from shared.search.service import search
from shared.settings import get_settings
from shared.stores.compose import connect

TOP = 5
MRR_DEPTH = 10
STUB_WORDS = 12
CRUMB_WORDS = 8  # fewer words than this is a crumb: no passage answers in so few
KINDS = ("answerable", "near_topic", "off_topic")
SPLITS = ("tune", "test")
STYLES = ("formal", "casual")
# The figures whose difference between the halves the set reports (``split_gaps``): the
# targets of the decision and the ranking. A near-topic question is caught when it is
# abstained or sent to verify.
GAP_FIGURES = (
    "answer_chunk_at_5",
    "answer_chunk_at_1",
    "file_mrr_at_10",
    "answerable_answered",
    "answerable_verify",
    "casual_answer_chunk_at_5",
    "casual_answered",
    "casual_verify",
    "casual_abstained",
    "near_topic_caught",
    "off_topic_abstained",
)
GAP_RESAMPLES = 1000


class DevSetError(ValueError):
    """The set's directory or its questions file is not usable (the CLI says why)."""


@dataclass(frozen=True)
class Question:
    id: str
    question: str
    kind: str
    file: str | None
    evidence: str | None
    split: str = "tune"
    style: str = "formal"


def load_questions(path: Path) -> list[Question]:
    questions = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            question = Question(
                row["id"],
                row["question"],
                row["kind"],
                row.get("file"),
                row.get("evidence"),
                row.get("split", "tune"),
                row.get("style", "formal"),
            )
        except (ValueError, KeyError, TypeError) as e:
            raise DevSetError(f"{path}:{number}: not a question ({e})") from e
        if question.kind not in KINDS:
            raise DevSetError(f"{path}:{number}: kind must be one of {KINDS}")
        if question.split not in SPLITS or question.style not in STYLES:
            raise DevSetError(f"{path}:{number}: split must be one of {SPLITS}, style {STYLES}")
        if question.kind == "answerable" and not (question.file and question.evidence):
            raise DevSetError(f"{path}:{number}: an answerable question needs file and evidence")
        questions.append(question)
    return questions


def uploads_of(tenant_id: str, files: Path) -> list[Upload]:
    """The uploads ``concord sync`` makes of the set's files (its stem as each one's title):
    the set is measured as a user's synced directory is searched."""
    return [
        file_upload(tenant_id, path, path.name)
        for path in sorted(p for p in files.iterdir() if p.is_file())
    ]


def normalized(text: str) -> str:
    """Text as compared with an evidence span: NFKC (ligatures), case-folded, Markdown's
    inline marks (`code`, *emphasis*, list bullets) dropped, spaces before punctuation and
    runs of whitespace collapsed: a span quoted from a Markdown file is found in the same
    page's HTML (one result stands for both, ``copies``), and the other way round."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = re.sub(r"[`*]", "", text)
    text = re.sub(r"\s+", " ", text)
    return re.sub(r" ([.,;:!?)\]])", r"\1", text).strip()


def holds_evidence(text: str, evidence: str, ocr: bool = False) -> bool:
    """A chunk holds the evidence when it holds the span, or (a span cut by a chunk
    boundary) at least 80 % of its words in one run of the chunk; a chunk read by OCR (which
    misreads a character here and there) also when a run of it matches those words at
    ``OCR_SIMILARITY``."""
    chunk, span = normalized(text), normalized(evidence)
    if span in chunk:
        return True
    words = span.split()
    needed = max(1, int(len(words) * 0.8 + 0.999))
    for start in range(len(words) - needed + 1):
        if " ".join(words[start : start + needed]) in chunk:
            return True
    return ocr and _similar_run(chunk.split(), words, needed)


OCR_SIMILARITY = 0.9


def _similar_run(chunk_words: list[str], words: list[str], needed: int) -> bool:
    """Whether ``needed`` consecutive words of the span match a run of the chunk's words of
    the same length at OCR_SIMILARITY (difflib's ratio of the two texts)."""
    for start in range(len(words) - needed + 1):
        wanted = " ".join(words[start : start + needed])
        for at in range(max(1, len(chunk_words) - needed + 1)):
            window = " ".join(chunk_words[at : at + needed])
            if difflib.SequenceMatcher(None, window, wanted).ratio() >= OCR_SIMILARITY:
                return True
    return False


# A navigation line: a texinfo/Sphinx page bar, a "skip to content" link, a table of
# contents' title, a breadcrumb ("Home » Docs » Path"; not "|", which a table row has too).
_NAVIGATION_LINE = re.compile(
    r"^\s*((next|previous|prev|up|home)\s*:|skip to (main )?content|table of contents|contents\s*$"
    r"|[^\w\n]*(\w[^\n]{0,40}?\s*[\u00bb\u203a]\s*){2,})",
    re.IGNORECASE,
)


def is_noise(text: str, section: str) -> bool:
    """A result no reader wants: no words at all, only its own heading (the last part of
    its section path), or mostly navigation lines."""
    words = normalized(text)
    if not re.search(r"\w", words):
        return True
    heading = normalized(section.rsplit(" > ", 1)[-1]) if section else ""
    if heading and words == heading:
        return True
    lines = [line for line in text.splitlines() if line.strip()]
    return sum(bool(_NAVIGATION_LINE.match(line)) for line in lines) * 2 > len(lines)


def same_text(uploads: list[Upload]) -> dict[str, str]:
    """Each file's name -> the name of the first file with the same bytes (a page shipped
    under two names answers a question about either)."""
    first: dict[bytes, str] = {}
    return {u.external_id: first.setdefault(u.raw, u.external_id) for u in uploads}


def score_question(
    question: Question,
    results: list[SearchResult],
    status: str,
    canonical: dict[str, str],
    packed: list[str] | None = None,
) -> dict[str, Any]:
    """One question's figures from its first ``MRR_DEPTH`` results (and the texts of the
    evidence it packed)."""
    top = results[:TOP]
    # each result's files: its own and those of the copies it stands for (one result with
    # both provenances answers a question about either)
    ranked = [
        {
            canonical.get(f or "", f)
            for f in [r.external_id, *(c.external_id for c in r.copies or [])]
        }
        for r in results[:MRR_DEPTH]
    ]
    files = ranked[:TOP]
    texts = [normalized(r.text) for r in top]
    row: dict[str, Any] = {
        "id": question.id,
        "kind": question.kind,
        "split": question.split,
        "style": question.style,
        "status": status,
        "noise": sum(is_noise(r.text, r.section) for r in top),
        "stubs": sum(len(r.text.split()) < STUB_WORDS for r in top),
        "crumbs": sum(len(r.text.split()) < CRUMB_WORDS for r in top),
        "repeats": sum(t in texts[:i] for i, t in enumerate(texts)),
        "results": len(top),
    }
    if question.kind == "answerable":
        assert question.file is not None and question.evidence is not None
        wanted = canonical.get(question.file, question.file)
        row["file"] = question.file
        row["format"] = Path(question.file).suffix.lstrip(".") or "text"
        row["file_hit"] = any(wanted in f for f in files)
        row["file_rank"] = next((i for i, f in enumerate(ranked, start=1) if wanted in f), None)
        row["answer_rank"] = next(
            (
                rank
                for rank, (r, f) in enumerate(zip(top, files, strict=True), start=1)
                if wanted in f and holds_evidence(r.text, question.evidence, ocr="ocr" in r.flags)
            ),
            None,
        )
        row["answer_packed"] = any(holds_evidence(t, question.evidence) for t in packed or [])
    return row


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def share(items: list[dict[str, Any]], test: Any) -> float:
        return round(sum(1 for r in items if test(r)) / len(items), 3) if items else 0.0

    def mrr(items: list[dict[str, Any]]) -> float:
        reciprocal = [1 / r["file_rank"] if r["file_rank"] else 0.0 for r in items]
        return round(sum(reciprocal) / len(items), 3) if items else 0.0

    by_kind = {kind: [r for r in rows if r["kind"] == kind] for kind in KINDS}
    answerable = [r for r in by_kind["answerable"] if r.get("style", "formal") == "formal"]
    casual = [r for r in by_kind["answerable"] if r.get("style") == "casual"]
    shown = sum(r["results"] for r in rows) or 1
    formats = sorted({r["format"] for r in answerable})
    summary: dict[str, Any] = {
        "questions": {kind: len(items) for kind, items in by_kind.items()},
        "answer_chunk_at_5": share(answerable, lambda r: r["answer_rank"] is not None),
        "answer_chunk_at_1": share(answerable, lambda r: r["answer_rank"] == 1),
        # of the questions whose answer chunk is in the first 5: how often the evidence packed
        # for the answer holds it
        "answer_packed": share(
            [r for r in answerable if r["answer_rank"] is not None],
            lambda r: r.get("answer_packed", False),
        ),
        "file_at_5": share(answerable, lambda r: r["file_hit"]),
        "file_mrr_at_10": mrr(answerable),
        "per_format": {
            f: {
                "questions": len(items),
                "answer_chunk_at_5": share(items, lambda r: r["answer_rank"] is not None),
                "file_mrr_at_10": mrr(items),
            }
            for f in formats
            for items in [[r for r in answerable if r["format"] == f]]
        },
        "answerable_answered": share(answerable, lambda r: r["status"] == "answerable"),
        "answerable_verify": share(answerable, lambda r: r["status"] == "verify"),
        "answerable_abstained": share(answerable, lambda r: r["status"] == "abstain"),
        "casual_questions": len(casual),
        "casual_answer_chunk_at_5": share(casual, lambda r: r["answer_rank"] is not None),
        "casual_answered": share(casual, lambda r: r["status"] == "answerable"),
        "casual_verify": share(casual, lambda r: r["status"] == "verify"),
        "casual_abstained": share(casual, lambda r: r["status"] == "abstain"),
        "noise_share_of_top_5": round(sum(r["noise"] for r in rows) / shown, 3),
        "stub_share_of_top_5": round(sum(r["stubs"] for r in rows) / shown, 3),
        "crumb_share_of_top_5": round(sum(r.get("crumbs", 0) for r in rows) / shown, 3),
        "repeat_share_of_top_5": round(sum(r["repeats"] for r in rows) / shown, 3),
    }
    for kind in ("near_topic", "off_topic"):
        items = by_kind[kind]
        summary[f"{kind}_abstained"] = share(items, lambda r: r["status"] == "abstain")
        summary[f"{kind}_verify"] = share(items, lambda r: r["status"] == "verify")
        summary[f"{kind}_answered"] = share(items, lambda r: r["status"] == "answerable")
    summary["near_topic_caught"] = share(
        by_kind["near_topic"], lambda r: r["status"] != "answerable"
    )
    return summary


def split_gaps(
    rows: list[dict[str, Any]], resamples: int = GAP_RESAMPLES, seed: int = 47
) -> dict[str, dict[str, Any]]:
    """For each of GAP_FIGURES, ``tune`` minus ``test`` and the 95 % interval of that
    difference over ``resamples`` bootstrap draws of each half.

    A half is drawn by its files: the questions of one file (its ``file``) share its
    chunking and its vocabulary and succeed or fail together, so the draw takes a file with
    all its questions of a kind and style; near-topic and off-topic questions, of no file,
    are drawn one by one. Each kind and style is drawn apart, so a draw asks about as many
    of each as the half does. The halves are a few hundred questions on a few dozen files
    each: a difference whose interval spans zero is one the sampling of the halves alone may
    give, not a sign that what was tuned on ``tune`` fails to carry over to ``test``."""
    draw = random.Random(seed)
    Cluster = list[dict[str, Any]]

    def strata(split: str) -> list[list[Cluster]]:
        groups: dict[tuple[str, str], dict[str, Cluster]] = {}
        for r in rows:
            if r["split"] == split:
                stratum = groups.setdefault((r["kind"], r.get("style", "formal")), {})
                stratum.setdefault(r.get("file") or r["id"], []).append(r)
        return [list(clusters.values()) for clusters in groups.values()]

    def resampled(half: list[list[Cluster]]) -> list[dict[str, Any]]:
        return [r for s in half for cluster in draw.choices(s, k=len(s)) for r in cluster]

    def every(half: list[list[Cluster]]) -> list[dict[str, Any]]:
        return [r for s in half for cluster in s for r in cluster]

    tune, test = strata("tune"), strata("test")
    observed_tune, observed_test = summarize(every(tune)), summarize(every(test))
    differences: dict[str, list[float]] = {f: [] for f in GAP_FIGURES}
    for _ in range(resamples):
        a, b = summarize(resampled(tune)), summarize(resampled(test))
        for f in GAP_FIGURES:
            differences[f].append(a[f] - b[f])
    gaps = {}
    for f in GAP_FIGURES:
        ordered = sorted(differences[f])
        low, high = nearest_rank(ordered, 2.5), nearest_rank(ordered, 97.5)
        gaps[f] = {
            "tune_minus_test": round(observed_tune[f] - observed_test[f], 3),
            "interval_95": [round(low, 3), round(high, 3)],
        }
    return gaps


def run_devset(
    directory: Path, out: Path, progress: Progress, tenant_id: str = "eval-real-docs"
) -> dict[str, Any]:
    files, questions_file = directory / "files", directory / "questions.jsonl"
    if not files.is_dir() or not questions_file.is_file():
        raise DevSetError(f"{directory} needs files/ and questions.jsonl")
    questions = load_questions(questions_file)
    uploads = uploads_of(tenant_id, files)
    synced = sync_uploads(tenant_id, uploads, progress, timeout_s=1800)
    canonical = same_text(uploads)
    settings = get_settings()
    # as beat would within its interval: the tenant's threshold from its own corpus
    stores = connect(settings)
    calibrated = calibrate(stores, unit_of_work, tenant_id, settings)
    rows, latencies = [], []
    for i, question in enumerate(questions, start=1):
        started = time.perf_counter()
        response = search(
            stores,
            unit_of_work,
            tenant_id,
            SearchRequest(query=question.question, top_k=MRR_DEPTH),
            settings=settings,
        )
        latencies.append((time.perf_counter() - started) * 1e3)
        packed = [item.text for item in response.evidence.items]
        row = score_question(
            question, response.results, response.decision.status, canonical, packed
        )
        row["reason"] = response.decision.reason
        row["top"] = [
            {"file": r.external_id, "section": r.section, "text": r.text[:160]}
            for r in response.results[:3]
        ]
        rows.append(row)
        progress("questions", i, len(questions))
    summary = summarize(rows)
    summary["splits"] = {
        split: summarize([r for r in rows if r["split"] == split]) for split in SPLITS
    }
    summary["split_gaps"] = split_gaps(rows)
    summary["documents"] = {"files": len(uploads), "failed": synced.failed or {}}
    summary["search_ms_p50"] = round(statistics.median(latencies), 1)
    summary["calibration"] = dataclasses.asdict(calibrated) if calibrated else None
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "questions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return summary
