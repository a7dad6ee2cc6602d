"""SQLAlchemy models: Postgres is the source of truth for everything Concord knows.

The schema itself is created by Alembic migrations (``migrations/``), never at run time;
``alembic check`` keeps these models and the migrations from drifting apart.
"""

from __future__ import annotations

import enum
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    LargeBinary,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    func,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from shared.vector_type import EmbeddingVector

EMBEDDING_DIM = 384


class Base(DeclarativeBase):
    pass


def _now() -> Mapped[datetime]:
    return mapped_column(DateTime(timezone=True), server_default=func.now(), nullable=False)


class JobState(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    INDEXED = "indexed"
    FAILED = "failed"
    DEAD_LETTERED = "dead_lettered"


class OutboxOp(enum.StrEnum):
    INDEX = "index"
    DELETE = "delete"
    REPAIR = "repair"  # index from reconciliation (may overwrite an equal version)
    PURGE = "purge"  # delete from reconciliation (may remove an equal version)


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(Text, nullable=False)
    created_at: Mapped[datetime] = _now()


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), nullable=False, index=True)
    name: Mapped[str] = mapped_column(Text, nullable=False)
    # Only a SHA-256 of the secret is stored; the prefix lets operators tell keys apart.
    key_prefix: Mapped[str] = mapped_column(String(16), nullable=False)
    key_hash: Mapped[str] = mapped_column(String(64), nullable=False, unique=True)
    scopes: Mapped[list[str]] = mapped_column(ARRAY(Text), nullable=False)
    created_at: Mapped[datetime] = _now()
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Document(Base):
    __tablename__ = "documents"
    __table_args__ = (UniqueConstraint("tenant_id", "external_id"),)

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), nullable=False)
    external_id: Mapped[str] = mapped_column(Text, nullable=False)
    title: Mapped[str] = mapped_column(Text, nullable=False, default="")
    metadata_: Mapped[dict[str, Any]] = mapped_column(
        "metadata", JSONB, nullable=False, default=dict
    )
    # The live version: monotonically increasing; a delete is a new (tombstone) version.
    version: Mapped[int] = mapped_column(Integer, nullable=False)
    content_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    deleted: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()


class DocumentVersion(Base):
    __tablename__ = "document_versions"

    document_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("documents.id", ondelete="CASCADE"), primary_key=True
    )
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(64), nullable=False)
    content_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    content_type: Mapped[str] = mapped_column(Text, nullable=False)
    filename: Mapped[str | None] = mapped_column(Text)
    # The raw upload, so a lost queue message can always be re-processed from Postgres.
    raw: Mapped[bytes | None] = mapped_column(LargeBinary)
    tombstone: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    created_at: Mapped[datetime] = _now()


class Chunk(Base):
    """Partitioned by tenant (migration 0013): small tenants share the DEFAULT partition
    ``chunks_shared`` (no HNSW index: their dense search is an exact scan of their rows); a
    large one has a partition, and an HNSW graph, of its own (shared/stores/partitions.py)."""

    __tablename__ = "chunks"
    __table_args__ = (
        Index("ix_chunks_tenant_document", "tenant_id", "document_id"),
        Index("ix_chunks_tenant_bucket", "tenant_id", "bucket"),
        Index(
            "ix_chunks_metadata_gin",
            "metadata",
            postgresql_using="gin",
            postgresql_ops={"metadata": "jsonb_path_ops"},
        ),
        {"postgresql_partition_by": "LIST (tenant_id)"},
    )

    # Deterministic: "<document id>:<ordinal>", so replays overwrite instead of duplicating.
    # The key is (id, tenant_id) because a partitioned table's keys hold the partition key.
    id: Mapped[str] = mapped_column(Text, primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    document_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("documents.id", ondelete="CASCADE"), nullable=False
    )
    version: Mapped[int] = mapped_column(Integer, nullable=False)
    ordinal: Mapped[int] = mapped_column(Integer, nullable=False)
    text: Mapped[str] = mapped_column(Text, nullable=False)
    text_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    char_start: Mapped[int] = mapped_column(Integer, nullable=False)
    char_end: Mapped[int] = mapped_column(Integer, nullable=False)
    section: Mapped[str] = mapped_column(Text, nullable=False, default="")
    # The title of this chunk's version (the document's may already be a newer version's).
    title: Mapped[str] = mapped_column(Text, nullable=False, server_default="")
    # In the embedder's tokens, so evidence packing needs no tokenizer on the read path.
    token_count: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    # What parsing noticed about the chunk's text (e.g. doubtful_extraction: its PDF page has
    # little or no text layer); the evidence policy asks for verification of such evidence.
    # Postgres only: search reads it at hydration, Elasticsearch never needs it.
    flags: Mapped[list[str]] = mapped_column(ARRAY(Text), nullable=False, server_default="{}")
    # In the embedder's tokens, the chunk's first sentence (NULL for chunks written before
    # migration 0014): the evidence policy omits a chunk whose first sentence cannot fit what
    # is left of its token budget without reading the chunk's text.
    first_sentence_tokens: Mapped[int | None] = mapped_column(Integer)
    # Reconciliation compares the stores bucket by bucket (see shared/reconcile).
    bucket: Mapped[int] = mapped_column(SmallInteger, nullable=False, server_default="0")
    # A hash of the id and every field Elasticsearch copies (shared/stores/buckets.py).
    fingerprint: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    # A copy of the document's metadata, so filters apply inside the HNSW scan itself.
    metadata_: Mapped[dict[str, Any]] = mapped_column(
        "metadata", JSONB, nullable=False, server_default="{}"
    )
    embedding: Mapped[Any] = mapped_column(EmbeddingVector(EMBEDDING_DIM), nullable=False)
    updated_at: Mapped[datetime] = _now()


class EmbeddingCache(Base):
    __tablename__ = "embedding_cache"

    model: Mapped[str] = mapped_column(Text, primary_key=True)
    text_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    embedding: Mapped[Any] = mapped_column(EmbeddingVector(), nullable=False)
    created_at: Mapped[datetime] = _now()


class IngestJob(Base):
    __tablename__ = "ingest_jobs"
    __table_args__ = (
        Index("ix_ingest_jobs_state_lease", "state", "lease_expires_at"),
        Index("ix_ingest_jobs_tenant_created", "tenant_id", "created_at"),
        Index("ix_ingest_jobs_document_version", "document_id", "version", "created_at"),
        # Fair claims: the tenants with queued jobs, and each one's oldest
        Index(
            "ix_ingest_jobs_queued_tenant",
            "tenant_id",
            "created_at",
            postgresql_where="state = 'queued'",
        ),
        ForeignKeyConstraint(
            ["document_id", "version"],
            ["document_versions.document_id", "document_versions.version"],
            ondelete="CASCADE",
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(64), nullable=False)
    document_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False)
    version: Mapped[int] = mapped_column(Integer, nullable=False)
    state: Mapped[str] = mapped_column(String(16), nullable=False)
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    # Attempts that ended with no outcome of the job's own (its worker lost, its batch out of
    # time): from ISOLATE_AFTER_LOST_ATTEMPTS on, the job runs alone (shared/jobs/service.py).
    attempts_lost: Mapped[int] = mapped_column(
        Integer, nullable=False, default=0, server_default="0"
    )
    # While the lease runs, the job belongs to whoever holds it; the sweep re-enqueues the
    # job once it expires, so recovery never depends on Redis redelivery.
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    error_stage: Mapped[str | None] = mapped_column(Text)
    error_class: Mapped[str | None] = mapped_column(Text)
    error_message: Mapped[str | None] = mapped_column(Text)
    stage_timings: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, default=dict)
    detail: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, default=dict)
    created_at: Mapped[datetime] = _now()
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class EsOutbox(Base):
    __tablename__ = "es_outbox"
    __table_args__ = (
        Index("ix_es_outbox_next_attempt", "next_attempt_at", "id"),
        Index("ix_es_outbox_tenant", "tenant_id", "id"),  # fair claims: round-robin by tenant
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(String(64), nullable=False)
    chunk_id: Mapped[str] = mapped_column(Text, nullable=False)
    document_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False)
    op: Mapped[str] = mapped_column(String(8), nullable=False)
    version: Mapped[int] = mapped_column(Integer, nullable=False)
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    next_attempt_at: Mapped[datetime] = _now()
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _now()


class DeadLetter(Base):
    __tablename__ = "dead_letters"
    __table_args__ = (Index("ix_dead_letters_tenant_created", "tenant_id", "created_at"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(String(64), nullable=False)
    source: Mapped[str] = mapped_column(String(16), nullable=False)  # "job" | "outbox"
    ref: Mapped[str] = mapped_column(Text, nullable=False)
    stage: Mapped[str] = mapped_column(Text, nullable=False)
    error_class: Mapped[str] = mapped_column(Text, nullable=False)
    message: Mapped[str] = mapped_column(Text, nullable=False)
    attempts: Mapped[int] = mapped_column(Integer, nullable=False)
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, default=dict)
    created_at: Mapped[datetime] = _now()
    # Discarded by an operator: hidden from lists and counts, kept for what it refused (the
    # content digest sync holds back).
    discarded_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


# Outbox dead letters are looked up by chunk id (reconcile); other refs may be long.
Index("ix_dead_letters_outbox_ref", DeadLetter.ref, postgresql_where=DeadLetter.source == "outbox")


class ReconcileRun(Base):
    __tablename__ = "reconcile_runs"
    __table_args__ = (Index("ix_reconcile_runs_started", "started_at"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str | None] = mapped_column(String(64))  # None: every tenant
    started_at: Mapped[datetime] = _now()
    duration_s: Mapped[float] = mapped_column(Float, nullable=False)
    repair: Mapped[bool] = mapped_column(Boolean, nullable=False)
    report: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)


class SearchProfile(Base):
    """Named search settings of one tenant (fusion, depths, boosts, thresholds), e.g. written
    by ``concord tune``; a search request names one with ``profile``."""

    __tablename__ = "search_profiles"

    tenant_id: Mapped[str] = mapped_column(String(64), ForeignKey("tenants.id"), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    settings: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)
    description: Mapped[str] = mapped_column(Text, nullable=False, default="")
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()


class TenantCalibration(Base):
    """The dense-score threshold of the default decision, set from the tenant's own corpus
    (shared/search/calibration.py): above the best cosines of questions far from it, below
    those of questions drawn from it. None where the two overlap (the default stays)."""

    __tablename__ = "tenant_calibrations"

    tenant_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    min_score: Mapped[float | None] = mapped_column(Float)
    chunks: Mapped[int] = mapped_column(Integer, nullable=False)  # the corpus it was set on
    corpus_low: Mapped[float] = mapped_column(Float, nullable=False)
    background_high: Mapped[float] = mapped_column(Float, nullable=False)
    samples: Mapped[int] = mapped_column(Integer, nullable=False)
    computed_at: Mapped[datetime] = _now()


class TrainedReranker(Base):
    """A cross-encoder fine-tuned on one tenant's judgements (``concord reranker train``); a
    search request or profile selects it by name with ``rerank.model``."""

    __tablename__ = "trained_rerankers"

    tenant_id: Mapped[str] = mapped_column(String(64), ForeignKey("tenants.id"), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    # A fresh directory per training run, so a process that cached the previous model by path
    # never mixes it up with the new one.
    path: Mapped[str] = mapped_column(Text, nullable=False)
    base_model: Mapped[str] = mapped_column(Text, nullable=False)
    card: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)
    created_at: Mapped[datetime] = _now()


class TrainedAnswerability(Base):
    """An answerability model learned from one tenant's judgements (``concord answerability
    train``): the whole model (a few hundred numbers) and its thresholds in ``model``, so every
    host reads it from Postgres; ``policy.score_type: "answerability"`` selects it."""

    __tablename__ = "answerability_models"

    tenant_id: Mapped[str] = mapped_column(String(64), ForeignKey("tenants.id"), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    model: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)
    card: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)
    created_at: Mapped[datetime] = _now()


class WebhookEndpoint(Base):
    """Where a tenant wants to hear of its jobs: a URL, the events it wants, and the secret
    its deliveries are signed with (kept to sign; shown once, when created)."""

    __tablename__ = "webhook_endpoints"
    __table_args__ = (Index("ix_webhook_endpoints_tenant", "tenant_id"),)

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(64), ForeignKey("tenants.id"), nullable=False)
    url: Mapped[str] = mapped_column(Text, nullable=False)
    events: Mapped[list[str]] = mapped_column(ARRAY(Text), nullable=False)
    secret: Mapped[str] = mapped_column(Text, nullable=False)
    created_at: Mapped[datetime] = _now()
    # The circuit breaker (shared/webhooks/delivery.py): failed attempts in a row, and until
    # when its deliveries wait once they reached webhook_breaker_failures.
    consecutive_failures: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    parked_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class WebhookDelivery(Base):
    """One event for one endpoint: written in the transaction that changed what it reports
    (an outbox), so none is lost; sent, and retried with backoff until delivered or given up."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        Index("ix_webhook_deliveries_due", "next_attempt_at", postgresql_where="state = 'pending'"),
        Index("ix_webhook_deliveries_endpoint", "endpoint_id", "id"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    endpoint_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("webhook_endpoints.id", ondelete="CASCADE"), nullable=False
    )
    tenant_id: Mapped[str] = mapped_column(String(64), nullable=False)
    event: Mapped[str] = mapped_column(String(32), nullable=False)
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)
    state: Mapped[str] = mapped_column(String(16), nullable=False)  # pending, delivered, failed
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    next_attempt_at: Mapped[datetime] = _now()
    last_status: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _now()
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class TrainingJob(Base):
    """A reranker training run started in the background; the jobs API reports it."""

    __tablename__ = "training_jobs"
    __table_args__ = (Index("ix_training_jobs_tenant_created", "tenant_id", "created_at"),)

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(64), nullable=False)
    name: Mapped[str] = mapped_column(String(64), nullable=False)
    state: Mapped[str] = mapped_column(String(16), nullable=False)
    params: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)
    progress: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, default=dict)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()
