"""The evaluation report: one JSON file (everything), a Markdown summary and PNG plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt

from evaluation.metrics import METRICS

# Published nDCG@10 figures for SciFact test, shown next to the measured ones.
SCIFACT_ANCHORS = {
    "BM25, Elasticsearch (BEIR paper)": 0.665,
    "BM25, Pyserini (BEIR leaderboard)": 0.679,
    "all-MiniLM-L6-v2 dense, exact search (MTEB)": 0.645,
}


def anchors_for(dataset: str) -> dict[str, float]:
    return SCIFACT_ANCHORS if dataset.lower() == "scifact" else {}


def write_report(report: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": out_dir / "report.json",
        "markdown": out_dir / "report.md",
        "quality_png": out_dir / "quality.png",
        "latency_png": out_dir / "latency.png",
    }
    rows = [c for c in report["configs"] if not c.get("unavailable")]
    _quality_plot(rows, report, paths["quality_png"])
    _latency_plot(rows, paths["latency_png"])
    if report.get("abstain"):
        paths["abstain_png"] = out_dir / "abstain_sweep.png"
        _abstain_plot(report["abstain"], paths["abstain_png"])
        if report["abstain"].get("policies"):
            paths["abstain_roc_png"] = out_dir / "abstain_roc.png"
            _roc_plot(report["abstain"]["policies"], paths["abstain_roc_png"])
    report["files"] = {k: str(p) for k, p in paths.items()}
    paths["json"].write_text(json.dumps(report, indent=2))
    paths["markdown"].write_text(markdown(report))
    return paths


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# Concord evaluation: {report['dataset']} ({report['split']} split)",
        "",
        f"{report['queries']} judged queries, {report['corpus_documents']} documents "
        f"({report['chunks']} chunks) in tenant `{report['tenant']}`; generated "
        f"{report['generated_at']}.",
        "",
        "| configuration | nDCG@10 | Recall@10 | Recall@100 | MRR@10 | 1-Recall@20 "
        "| p50 ms | p95 ms | p99 ms | rerank stage p50 / p95 ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in report["configs"]:
        if c.get("unavailable"):
            lines.append(f"| {c['name']} | not run: {c['unavailable']} ||||||||| ")
            continue
        m, lat = c["metrics"], c["latency_ms"]
        rerank = c.get("rerank_stage_ms")
        lines.append(
            f"| {c['name']} | "
            + " | ".join(f"{m[k]:.4f}" for k in METRICS)
            + f" | {lat['p50']} | {lat['p95']} | {lat['p99']} | "
            + (f"{rerank['p50']} / {rerank['p95']} |" if rerank else "- |")
        )
    if report.get("anchors"):
        lines += ["", "Published anchors (nDCG@10):", ""]
        lines += [f"- {name}: {value:.3f}" for name, value in report["anchors"].items()]
    if report.get("targets"):
        lines += ["", "| target | measured | met |", "|---|---|---|"]
        lines += [
            f"| {t['target']} | {t['measured']} | {'yes' if t['met'] else 'no'} |"
            for t in report["targets"]
        ]
    if report.get("abstain"):
        lines += _abstain_section(report["abstain"])
    if report.get("peer"):
        lines += ["", f"Peer: {report['peer'].get('system', report['peer'])}"]
    lines += ["", "Files: " + ", ".join(f"`{p}`" for p in report.get("files", {}).values()), ""]
    return "\n".join(lines)


def _abstain_section(a: dict[str, Any]) -> list[str]:
    """The unanswerable variant's table: each policy's abstain recall and false abstains."""
    lines: list[str] = []
    lines += [
        "",
        "## Abstain accuracy (unanswerable variant)",
        "",
        f"{a['withheld_documents']} documents withheld; {a['unanswerable']} unanswerable and "
        f"{a['answerable']} answerable queries (seed {a['seed']}).",
        "",
        "| policy | threshold | abstain recall | false abstain |",
        "|---|---|---|---|",
    ]
    for row in a["served"]:
        lines.append(
            f"| {row['policy']} | {row['threshold']} | {row['abstain_recall']:.4f} "
            f"| {row['false_abstain']:.4f} |"
        )
    best = a["best_within_5pct_false_abstain"]
    lines += [
        "",
        f"Best threshold with ≤ 5 % false abstain: {best['threshold']} → abstain recall "
        f"{best['abstain_recall']:.4f}, false abstain {best['false_abstain']:.4f}.",
    ]
    if a.get("policies"):
        lines += [
            "",
            "Each policy's score as an abstain classifier (curve in `abstain_roc.png`):",
            "",
            "| policy | ROC AUC | abstain recall at ≤ 5 % false abstain | its threshold "
            "| verify share (served) |",
            "|---|---|---|---|---|",
        ]
        for p in a["policies"]:
            b = p["best_within_5pct_false_abstain"]
            lines.append(
                f"| {p['policy']} | {p['auc']:.4f} | {b['abstain_recall']:.4f} "
                f"(false abstain {b['false_abstain']:.4f}) | {b['threshold']} "
                f"| {p['verify_share']:.4f} |"
            )
    return lines


def _quality_plot(rows: list[dict[str, Any]], report: dict[str, Any], path: Path) -> None:
    names = [c["name"] for c in rows]
    fig, ax = plt.subplots(figsize=(max(8, len(names) * 0.9), 5))
    width = 0.4
    xs = range(len(names))
    ax.bar(
        [x - width / 2 for x in xs], [c["metrics"]["ndcg@10"] for c in rows], width, label="nDCG@10"
    )
    ax.bar(
        [x + width / 2 for x in xs],
        [c["metrics"]["recall@100"] for c in rows],
        width,
        label="Recall@100",
    )
    for name, value in report.get("anchors", {}).items():
        ax.axhline(value, linestyle="--", linewidth=0.8, label=f"{name}: {value}")
    ax.set_xticks(list(xs), names, rotation=40, ha="right")
    ax.set_ylim(0, 1)
    ax.set_title(f"{report['dataset']} {report['split']}: quality per configuration")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _latency_plot(rows: list[dict[str, Any]], path: Path) -> None:
    timed = [c for c in rows if c.get("latencies_ms")]
    fig, ax = plt.subplots(figsize=(max(8, len(timed) * 0.9), 5))
    ax.boxplot([c["latencies_ms"] for c in timed], showfliers=True, whis=(5, 95))
    ax.set_xticks(range(1, len(timed) + 1), [c["name"] for c in timed], rotation=40, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("latency per query, ms (log; whiskers p5-p95)")
    ax.set_title("Latency distribution per configuration")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _abstain_plot(abstain: dict[str, Any], path: Path) -> None:
    sweep = abstain["sweep"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ts = [row["threshold"] for row in sweep]
    ax.plot(ts, [row["abstain_recall"] for row in sweep], label="abstain recall (unanswerable)")
    ax.plot(ts, [row["false_abstain"] for row in sweep], label="false abstain (answerable)")
    ax.axhline(0.90, color="grey", linestyle=":", linewidth=0.8)
    ax.axhline(0.05, color="grey", linestyle=":", linewidth=0.8)
    ax.axvline(abstain["default_threshold"], color="black", linestyle="--", linewidth=0.8,
               label=f"default threshold {abstain['default_threshold']}")  # fmt: skip
    ax.set_xlabel(f"threshold on {abstain['score_type']}")
    ax.set_ylabel("rate")
    ax.set_title("Evidence policy threshold sweep")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _roc_plot(policies: list[dict[str, Any]], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 5))
    for p in policies:
        curve = p["curve"]
        ax.plot(
            [0.0] + [row["false_abstain"] for row in curve],
            [0.0] + [row["abstain_recall"] for row in curve],
            label=f"{p['policy']} (AUC {p['auc']:.3f})",
        )
    ax.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=0.8)
    ax.axvline(0.05, color="black", linestyle="--", linewidth=0.8, label="5 % false abstain")
    ax.set_xlabel("false abstain (answerable queries)")
    ax.set_ylabel("abstain recall (unanswerable queries)")
    ax.set_title("Abstain decision per policy, unanswerable variant")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
