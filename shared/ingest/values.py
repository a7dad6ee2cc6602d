"""The values the ingest steps pass forward, one kind per step:

    Claim ──parse──▶ Parsed ──chunk──▶ Chunked ──embed──▶ Encoded ──write──▶ JobOutcome
                                                  └─────▶ Waiting (its turn spent: queued again)

Each step (shared/ingest/steps.py) takes values and returns new ones, never changing what it
was given; each value knows the claim it comes of (``claim``), so the pipeline can charge a
failure to its job at any step. A value carries forward only what the next steps need: a
parsed document not the uploaded bytes, a chunked one not the parsed text (the bytes
themselves go when the batch's claims do, at the end of its run).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

from shared.ingest.chunking import TextChunk
from shared.parsing import ParsedDocument


@dataclass(frozen=True)
class Claim:
    """A job this worker has claimed: its document version's bytes, as uploaded."""

    job_id: uuid.UUID
    tenant_id: str
    document_id: uuid.UUID
    version: int
    raw: bytes
    content_type: str
    request_id: str | None = None  # of the upload that created the job, for the logs
    # When this claim of the job began (its started_at): which claim of it this one is.
    claimed_at: datetime | None = None

    @property
    def claim(self) -> Claim:
        """Itself: every step's value answers whose job it is the same way."""
        return self


@dataclass(frozen=True)
class Parsed:
    claim: Claim  # its bytes let go of
    document: ParsedDocument
    timings: Mapping[str, float]


@dataclass(frozen=True)
class Chunked:
    claim: Claim
    pieces: tuple[TextChunk, ...]
    hashes: tuple[str, ...]  # of each piece's text
    # What parsing left unread (pages past OCR's bounds), for the job's detail.
    parse_notes: tuple[str, ...]
    timings: Mapping[str, float]


@dataclass(frozen=True)
class Encoded:
    """A chunked document with a vector for every piece: ready to write."""

    chunked: Chunked
    vectors: tuple[np.ndarray, ...]
    cache_hits: int
    timings: Mapping[str, float]

    @property
    def claim(self) -> Claim:
        return self.chunked.claim


@dataclass(frozen=True)
class Waiting:
    """A chunked document whose turn ran out before all its pieces were encoded: those
    encoded are cached, the rest wait for its tenant's next turn."""

    chunked: Chunked
    left_to_encode: int

    @property
    def claim(self) -> Claim:
        return self.chunked.claim


@dataclass
class JobOutcome:
    job_id: str
    state: str
    detail: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "state": str(self.state), **self.detail}
