"""BEIR-format datasets: ``corpus.jsonl``, ``queries.jsonl`` and ``qrels/<split>.tsv``."""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Qrels = dict[str, dict[str, int]]  # query id -> document id -> graded relevance


class DatasetError(ValueError):
    """The directory is not a readable BEIR-format dataset; the message says what is wrong."""


@dataclass(frozen=True)
class Dataset:
    name: str
    path: Path
    corpus: list[dict[str, Any]]
    queries: dict[str, str]

    def qrels(self, split: str) -> Qrels:
        return read_qrels(self.path / "qrels" / f"{split}.tsv")

    def split_queries(self, split: str) -> list[tuple[str, str]]:
        """The split's judged queries (at least one relevant document), in qrels order."""
        qrels = self.qrels(split)
        missing = [qid for qid in qrels if qid not in self.queries]
        if missing:
            raise DatasetError(
                f"qrels/{split}.tsv names queries not in queries.jsonl: {missing[:5]}"
            )
        return [
            (qid, self.queries[qid]) for qid in qrels if any(r > 0 for r in qrels[qid].values())
        ]

    def queries_outside_test(self, split: str) -> tuple[list[tuple[str, str]], int]:
        """The split's judged queries that the test split does not judge (what tuning and
        training may learn from), and how many were left out for being judged there."""
        test_path = self.path / "qrels" / "test.tsv"
        test_ids = set(read_qrels(test_path)) if test_path.exists() else set()
        judged = self.split_queries(split)
        kept = [q for q in judged if q[0] not in test_ids]
        return kept, len(judged) - len(kept)


def tenant_slug(name: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:40] or "dataset"


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise DatasetError(f"{path} is missing")
    records = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(f"{path}:{number}: not JSON ({e.msg})") from e
            if not isinstance(record, dict) or "_id" not in record:
                raise DatasetError(f"{path}:{number}: a record needs an '_id'")
            records.append(record)
    return records


def read_qrels(path: Path) -> Qrels:
    if not path.is_file():
        raise DatasetError(f"{path} is missing")
    qrels: Qrels = {}
    with path.open(encoding="utf-8", newline="") as f:
        rows = csv.reader(f, delimiter="\t")
        for number, row in enumerate(rows, start=1):
            if not row or (number == 1 and row[0] == "query-id"):
                continue
            if len(row) < 3:
                raise DatasetError(f"{path}:{number}: expected query-id, corpus-id, score")
            try:
                score = int(row[2])
            except ValueError as e:
                raise DatasetError(f"{path}:{number}: score {row[2]!r} is not an integer") from e
            qrels.setdefault(row[0], {})[row[1]] = score
    return qrels


def load(path: Path) -> Dataset:
    if not path.is_dir():
        raise DatasetError(f"{path} is not a directory")
    corpus = _read_jsonl(path / "corpus.jsonl")
    queries = {str(q["_id"]): str(q.get("text", "")) for q in _read_jsonl(path / "queries.jsonl")}
    for record in corpus:
        record["_id"] = str(record["_id"])
    return Dataset(path.resolve().name, path.resolve(), corpus, queries)
