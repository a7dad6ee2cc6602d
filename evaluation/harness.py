"""``concord eval``: ingest a BEIR corpus through the real pipeline, run the split's queries
through the real search service for every configuration (and the Haystack peer, and an exact
dense scan), measure abstain accuracy on an unanswerable variant, and write the report."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from evaluation import abstain as abstain_eval
from evaluation import beir, peer, report
from evaluation.corpus import sync_corpus
from evaluation.metrics import evaluate, percentiles
from evaluation.runner import (
    EvalConfig,
    HttpPoster,
    Progress,
    RunResult,
    SearchClient,
    exact_dense,
    run_config,
    standard_configs,
)
from shared.answerability import service as answerability
from shared.db import unit_of_work
from shared.db.repository import count_rows
from shared.models import Chunk
from shared.rerankers import service as rerankers
from shared.search import profiles
from shared.settings import get_settings
from shared.tenants.service import create_key, revoke_key


@dataclass(frozen=True)
class EvalOptions:
    split: str = "test"
    depth: int = 150
    rerank: bool = True
    rerank_window: int = 20
    profile: str | None = None
    reranker: str | None = None  # a trained reranker of the dataset's tenant
    answerability: str | None = None  # its answerability model (default: "default" if any)
    peer: bool = True
    abstain: bool = True
    seed: int = 13
    max_queries: int | None = None
    only: tuple[str, ...] = ()  # run only these configurations (names as in the report)
    timeout_s: float = 3600


def eval_tenant(dataset: beir.Dataset) -> str:
    return f"eval-{beir.tenant_slug(dataset.name)}"


@contextlib.contextmanager
def temporary_key(tenant_id: str) -> Iterator[str]:
    """A read key for the run, revoked afterwards (the secret lives only in this process)."""
    with unit_of_work() as uow:
        key, secret = create_key(uow.session, tenant_id, "concord-eval", ["read"])
        key_id = key.id
    try:
        yield secret
    finally:
        with unit_of_work() as uow:
            revoke_key(uow.session, key_id)


def run_eval(
    dataset_dir: Path,
    out_dir: Path,
    options: EvalOptions,
    progress: Progress,
    http: HttpPoster | None = None,
) -> dict[str, Path]:
    settings = get_settings()
    dataset = beir.load(dataset_dir)
    qrels = dataset.qrels(options.split)
    queries = dataset.split_queries(options.split)[: options.max_queries]
    tenant = eval_tenant(dataset)
    with unit_of_work() as uow:  # fail before the long work, not after it
        if options.profile:
            profiles.get_profile(uow.session, tenant, options.profile)
        if options.reranker:
            rerankers.get(uow.session, tenant, options.reranker)
        if options.answerability:
            answerability.get(uow.session, tenant, options.answerability)

    started = time.monotonic()
    synced = sync_corpus(tenant, dataset.corpus, progress, options.timeout_s)
    ingest = {**vars(synced), "seconds": round(time.monotonic() - started, 1)}

    runs: dict[str, RunResult] = {}
    configs = standard_configs(
        options.depth, options.rerank_window, options.profile, options.reranker
    )
    if not options.rerank:
        configs = [c for c in configs if not c.reranks or c.trained_reranker]
    if options.only:
        configs = [c for c in configs if c.name in options.only]
    with temporary_key(tenant) as api_key:
        client = SearchClient(api_key, http)
        for config in configs:
            runs[config.name] = run_config(client, config, queries, progress)
    runs["exact_dense (sequential scan)"] = exact_dense(tenant, queries)

    peer_info: dict[str, Any] | None = None
    if options.peer:
        try:
            peer_runs, peer_info = peer.run_haystack(
                settings, dataset.path, f"eval-{beir.tenant_slug(dataset.name)}", queries
            )
            runs.update(peer_runs)
        except peer.PeerUnavailable as e:
            peer_info = {"system": f"not run: {e}"}

    abstain = (
        _abstain(dataset, queries, qrels, options, progress, http) if options.abstain else None
    )
    with unit_of_work() as uow:
        chunks = count_rows(uow.session, Chunk, tenant)
    rows = [_row(name, run, qrels, configs) for name, run in runs.items()]
    result: dict[str, Any] = {
        "dataset": dataset.name,
        "split": options.split,
        "queries": len(queries),
        "corpus_documents": len(dataset.corpus),
        "chunks": chunks,
        "tenant": tenant,
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "options": vars(options),
        "settings": {
            "embedding_model": settings.embedding_model_path(),
            "rerank_kind": settings.rerank_kind,
            "rerank_model": settings.rerank_model,
            "hnsw_ef_search": settings.hnsw_ef_search,
            "es_text_analyzer": settings.es_text_analyzer,
        },
        "ingest": ingest,
        "configs": rows,
        "anchors": report.anchors_for(dataset.name),
        "peer": peer_info,
        "abstain": abstain,
    }
    result["targets"] = targets(result)
    return report.write_report(result, out_dir)


def _row(name: str, run: RunResult, qrels: beir.Qrels, configs: list[EvalConfig]) -> dict[str, Any]:
    body = next((c.body for c in configs if c.name == name), None)
    return {
        "name": name,
        "system": name.split(":")[0] if name.startswith("haystack:") else "concord",
        "request": body,
        "unavailable": run.unavailable,
        "metrics": evaluate(run.rankings, {q: qrels[q] for q in run.rankings})
        if run.rankings
        else None,
        "latency_ms": percentiles(run.latencies_ms),
        "latencies_ms": [round(x, 2) for x in run.latencies_ms],
        "stage_ms_mean": {
            stage: round(sum(v) / len(v), 2) for stage, v in sorted(run.stage_ms.items())
        },
        "rerank_stage_ms": percentiles(run.stage_ms["rerank"])
        if run.stage_ms.get("rerank")
        else None,
    }


def _abstain(
    dataset: beir.Dataset,
    queries: list[tuple[str, str]],
    qrels: beir.Qrels,
    options: EvalOptions,
    progress: Progress,
    http: HttpPoster | None,
) -> dict[str, Any]:
    settings = get_settings()
    withholding = abstain_eval.withhold_half(queries, qrels, options.seed)
    tenant = f"{eval_tenant(dataset)}-unanswerable"
    kept = [r for r in dataset.corpus if r["_id"] not in withholding.withheld_docs]
    sync_corpus(tenant, kept, progress, options.timeout_s)
    served = []
    if options.profile:  # profiles belong to a tenant: the variant's tenant gets a copy
        with unit_of_work() as uow:
            source = profiles.get_profile(uow.session, eval_tenant(dataset), options.profile)
            profiles.save_profile(
                uow.session, tenant, source.name, source.settings, source.description
            )
    policies = _abstain_policies(dataset, tenant, options)
    with temporary_key(tenant) as api_key:
        client = SearchClient(api_key, http)
        defaults = abstain_eval.run_abstain(client, queries, progress, "abstain (defaults)")
        served.append(
            {
                "policy": "defaults",
                "threshold": settings.policy_min_score,
                **defaults.rates(withholding),
            }
        )
        if options.profile:
            tuned = abstain_eval.run_abstain(
                client,
                queries,
                progress,
                f"abstain ({options.profile})",
                {"profile": options.profile},
            )
            threshold = next(iter(tuned.decisions.values()))["threshold"]
            served.append(
                {
                    "policy": f"profile:{options.profile}",
                    "threshold": threshold,
                    **tuned.rates(withholding),
                }
            )
        compared = [(f"{settings.policy_score_type} (defaults)", defaults)]
        for label, body in policies:
            run = abstain_eval.run_abstain(client, queries, progress, f"abstain ({label})", body)
            threshold = next(iter(run.decisions.values()))["threshold"]
            served.append({"policy": label, "threshold": threshold, **run.rates(withholding)})
            compared.append((label, run))
    sweep = defaults.sweep(withholding)
    return {
        "seed": options.seed,
        "withheld_documents": len(withholding.withheld_docs),
        "unanswerable": len(withholding.unanswerable),
        "answerable": len(withholding.answerable),
        "score_type": settings.policy_score_type,
        "default_threshold": settings.policy_min_score,
        "served": served,
        "best_within_5pct_false_abstain": abstain_eval.best_threshold(sweep),
        "sweep": sweep,
        "policies": [
            {"policy": label, **abstain_eval.roc(run, withholding)} for label, run in compared
        ],
    }


def _abstain_policies(
    dataset: beir.Dataset, variant_tenant: str, options: EvalOptions
) -> list[tuple[str, dict[str, Any]]]:
    """The other policies compared on the variant: the rerank score (with the rerank stage:
    a configured cross-encoder's, and the trained ``--reranker``'s) and the dataset tenant's
    answerability model. The variant's tenant gets a copy of the models it uses (a model
    belongs to a tenant, as a profile does; a reranker's copy points at the same files)."""
    policies: list[tuple[str, dict[str, Any]]] = []
    rerank = {"enabled": True, "window": options.rerank_window}
    if options.rerank and get_settings().rerank_kind != "none":  # a configured cross-encoder
        policies.append(("rerank score", {"rerank": rerank, "policy": {"score_type": "rerank"}}))
    source_tenant = eval_tenant(dataset)
    with unit_of_work() as uow:
        if options.reranker:
            _share_reranker(uow.session, source_tenant, variant_tenant, options.reranker)
            policies.append(
                (
                    f"rerank score:{options.reranker}",
                    {
                        "rerank": {**rerank, "model": options.reranker},
                        "policy": {"score_type": "rerank"},
                    },
                )
            )
        name = options.answerability or answerability.DEFAULT_MODEL
        entries = answerability.list_for_tenant(uow.session, source_tenant)
        source = next((e for e in entries if e.name == name), None)
        if source is not None:
            answerability.register(uow.session, variant_tenant, name, source.model, source.card)
            if source.model.get("reranker"):
                _share_reranker(
                    uow.session, source_tenant, variant_tenant, source.model["reranker"]
                )
            policies.append(
                (
                    f"answerability:{name}",
                    {"policy": {"score_type": "answerability", "answerability_model": name}},
                )
            )
    return policies


def _share_reranker(session: Session, source_tenant: str, tenant: str, name: str) -> None:
    """Register ``source_tenant``'s reranker for the eval's variant tenant too, pointing at the
    same files (the variant exists for the eval; `concord reranker delete` of its copy would
    remove the source's files, so remove the variant tenant instead)."""
    entry = rerankers.get(session, source_tenant, name)
    rerankers.register(session, tenant, name, Path(entry.path), entry.base_model, entry.card)


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's acceptance targets, checked against this run's figures where they apply."""
    by_name = {c["name"]: c for c in result["configs"] if c.get("metrics")}

    def ndcg(name: str) -> float | None:
        return by_name[name]["metrics"]["ndcg@10"] if name in by_name else None

    checks: list[dict[str, Any]] = []
    if result["anchors"] and ndcg("lexical") is not None:
        checks.append(_check("lexical nDCG@10 ≥ 0.665", ndcg("lexical"), ndcg("lexical") >= 0.665))  # type: ignore[operator]
    dense, exact = ndcg("dense"), ndcg("exact_dense (sequential scan)")
    if dense is not None and exact is not None:
        checks.append(_check("dense within 0.005 of exact dense", f"{dense:.4f} vs {exact:.4f}",
                             abs(dense - exact) <= 0.005))  # fmt: skip
    # The best hybrid configuration run (none with --only lexical,dense: no hybrid targets).
    hybrid = max(
        ((ndcg(n) or 0.0, n) for n in by_name if n.startswith(("hybrid", "profile:"))),
        default=None,
    )
    if result["anchors"] and hybrid is not None:
        checks.append(
            _check("hybrid nDCG@10 ≥ 0.72", f"{hybrid[0]:.4f} ({hybrid[1]})", hybrid[0] >= 0.72)
        )
    peer = by_name.get("haystack:hybrid_rrf")
    if peer is not None and hybrid is not None:
        checks.append(_check("hybrid nDCG@10 ≥ Haystack hybrid",
                             f"{hybrid[0]:.4f} vs {peer['metrics']['ndcg@10']:.4f}",
                             hybrid[0] >= peer["metrics"]["ndcg@10"]))  # fmt: skip
        ours = by_name[hybrid[1]]["latency_ms"]["p95"]
        theirs = peer["latency_ms"]["p95"]
        checks.append(_check("hybrid p95 ≤ 0.5 x Haystack hybrid p95",
                             f"{ours} ms vs {theirs} ms (ratio {ours / theirs:.2f})",
                             ours <= 0.5 * theirs))  # fmt: skip
    for mode in ("lexical", "dense", "hybrid_rrf"):  # every mode as fast as the peer's or faster
        concord_run, peer_run = by_name.get(mode), by_name.get(f"haystack:{mode}")
        if concord_run is None or peer_run is None:
            continue
        for p in ("p50", "p95"):
            ms, peer_ms = concord_run["latency_ms"][p], peer_run["latency_ms"][p]
            checks.append(
                _check(
                    f"{mode} {p} ≤ Haystack {mode} {p}", f"{ms} ms vs {peer_ms} ms", ms <= peer_ms
                )
            )
    return checks


def _check(target: str, measured: Any, met: bool) -> dict[str, Any]:
    return {
        "target": target,
        "measured": measured if isinstance(measured, str) else f"{measured:.4f}",
        "met": bool(met),
    }
