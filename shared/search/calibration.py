"""Each tenant's dense-score threshold for the default decision, set from its own corpus with
no judgements: questions drawn from its chunks against questions from far away.

The default decision abstains (``below_threshold``) when the best chunk's cosine to the
question is under a threshold. One number for every corpus does not fit: the best cosines of
questions a corpus cannot answer run higher over a large biomedical corpus than over a few
software manuals (the background questions below: median 0.28 over SciFact, 0.20 over the
real-document set). So each tenant gets its own, from two samples:

* *its own questions*: from ``SAMPLE_CHUNKS`` of its chunks at random, a sentence each,
  reduced to its informative words as a person would ask them (``npm stage publish``);
* *far questions*: the everyday questions shipped in ``data/background_questions.txt``.

The threshold is midway between the low end of the first (``CORPUS_PERCENTILE``) and the
high end of the second (``BACKGROUND_PERCENTILE``). Where those overlap (a corpus about
health meets questions about health), the background says nothing about this tenant: no
threshold is set and the deployment's default stays. A tenant with fewer than
``MIN_SAMPLES`` questions drawn keeps the default too.

Calibration runs in the background (``calibrate_due``, from beat, for tenants whose corpus is
new or has grown or shrunk by ``RECALIBRATE_CHANGE`` since) and on demand (``concord
calibrate``). A search reads its tenant's threshold from a per-process cache, so the read
costs nothing on most searches; the decision says which threshold it used
(``threshold_source``).
"""

from __future__ import annotations

import logging
import random
import re
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from shared.db import Transactions
from shared.ingest.embedding import get_embedder
from shared.jobs import repository as jobs_repo
from shared.models import TenantCalibration
from shared.search import repository as repo
from shared.search.coverage import QueryTerms
from shared.settings import Settings
from shared.stores.compose import Stores

log = logging.getLogger(__name__)

BACKGROUND = Path(__file__).parent / "data" / "background_questions.txt"
SAMPLE_CHUNKS = 200
MIN_SAMPLES = 30
CORPUS_PERCENTILE = 5
BACKGROUND_PERCENTILE = 90
# A tenant is calibrated again once its chunk count has changed by this share.
RECALIBRATE_CHANGE = 0.25
TENANTS_PER_RUN = 5
CACHE_TTL_S = 60.0
QUESTION_WORDS = 6
# Sentence ends and line ends both: a hard-wrapped line (a man page's) is a question's worth of
# words, closer to a question's length than the chunker's whole sentences (with those, the
# real-document set's own questions ran 0.07 higher at the 5th percentile).
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")


@dataclass(frozen=True)
class Calibration:
    tenant_id: str
    min_score: float | None  # None: the samples overlap, the default threshold stays
    chunks: int
    corpus_low: float
    background_high: float
    samples: int


def own_questions(texts: list[str], seed: str) -> list[str]:
    """A question from each text that has a sentence of six words or more: the informative
    words of one of them, at most ``QUESTION_WORDS``, in their order."""
    rng = random.Random(seed)
    questions = []
    for text in texts:
        sentences = [s for s in _SENTENCE_END.split(text) if len(s.split()) >= 6]
        if not sentences:
            continue
        terms = QueryTerms.of(rng.choice(sentences))
        words = [terms.words[stem] for stem in terms.stems][:QUESTION_WORDS]
        if len(words) >= 3:
            questions.append(" ".join(words))
    return questions


@lru_cache(maxsize=1)
def background_questions() -> tuple[str, ...]:
    lines = BACKGROUND.read_text().splitlines()
    return tuple(line.strip() for line in lines if line.strip() and not line.startswith("#"))


def threshold(own: list[float], far: list[float]) -> tuple[float | None, float, float]:
    """(threshold or None, the low end of ``own``, the high end of ``far``)."""
    low = float(np.percentile(own, CORPUS_PERCENTILE))
    high = float(np.percentile(far, BACKGROUND_PERCENTILE))
    return (round((low + high) / 2, 4) if high < low else None), low, high


def calibrate(
    stores: Stores, transactions: Transactions, tenant_id: str, settings: Settings
) -> Calibration | None:
    """Calibrate the tenant and store it; None (nothing stored) for a corpus too small to
    draw ``MIN_SAMPLES`` questions from."""
    with transactions() as uow:
        store = stores.vectors(uow.session)
        chunks = store.count_of_tenant(tenant_id)
        texts = store.sample_texts(tenant_id, SAMPLE_CHUNKS, seed=0.5)
    questions = own_questions(texts, tenant_id)
    if len(questions) < MIN_SAMPLES:
        return None
    embedder = get_embedder()
    with transactions() as uow:
        store = stores.vectors(uow.session)

        def best(question: str) -> float:
            hits = store.nearest(tenant_id, embedder.embed_query(question).tolist(), 1)
            return hits[0][1] if hits else 0.0

        own = [best(q) for q in questions]
        far = [best(q) for q in background_questions()]
    min_score, low, high = threshold(own, far)
    result = Calibration(tenant_id, min_score, chunks, round(low, 4), round(high, 4), len(own))
    with transactions() as uow:
        repo.save_calibration(
            uow.session,
            TenantCalibration(
                tenant_id=tenant_id,
                min_score=min_score,
                chunks=chunks,
                corpus_low=result.corpus_low,
                background_high=result.background_high,
                samples=len(own),
            ),
        )
    log.info("calibrated tenant %s: %s", tenant_id, result)
    return result


def calibrate_due(
    stores: Stores, transactions: Transactions, settings: Settings, settled_only: bool = False
) -> list[Calibration]:
    """Calibrate up to ``TENANTS_PER_RUN`` tenants whose corpus was never calibrated or has
    changed by ``RECALIBRATE_CHANGE`` since (the biggest change first); with
    ``settled_only``, only those with no ingest job queued or running (a run asked for by
    an ingest batch: a tenant still uploading is calibrated when its last batch is written,
    on its whole corpus, not on the first tenth of it)."""
    with transactions() as uow:
        store = stores.vectors(uow.session)
        known = repo.calibrations(uow.session)
        counts = store.counts_by_tenant()
        unsettled = jobs_repo.tenants_with_jobs_in_flight(uow.session) if settled_only else set()
    due = []
    for tenant, chunks in counts.items():
        if tenant in unsettled:
            continue
        done = known.get(tenant)
        change = 1.0 if done is None else abs(chunks - done.chunks) / max(done.chunks, 1)
        if chunks >= MIN_SAMPLES and change >= RECALIBRATE_CHANGE:
            due.append((change, tenant))
    results = []
    for _, tenant in sorted(due, reverse=True)[:TENANTS_PER_RUN]:
        calibrated = calibrate(stores, transactions, tenant, settings)
        if calibrated is not None:
            results.append(calibrated)
    return results


_cache: dict[str, tuple[float, float | None]] = {}


def calibrated_min_score(transactions: Transactions, tenant_id: str) -> float | None:
    """The tenant's calibrated threshold (None: none set), read at most every
    ``CACHE_TTL_S`` per process."""
    read_at, value = _cache.get(tenant_id, (0.0, None))
    if time.monotonic() - read_at <= CACHE_TTL_S:
        return value
    with transactions() as uow:
        row = repo.calibration(uow.session, tenant_id)
        value = row.min_score if row is not None else None
    _cache[tenant_id] = (time.monotonic(), value)
    return value
