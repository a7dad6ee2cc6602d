"""The layout's rules, checked: run ``python scripts/check_layout.py`` (the test suite does).

1. Every SQL statement is in a ``repository.py`` (or a migration): no other module imports a
   statement constructor (select, insert, update, delete, text) from SQLAlchemy or runs
   ``execute``/``scalar``/``scalars`` (but a Redis pipeline's ``execute``, on a name ``pipe``)
   or a session's ``add``/``get``/``delete``.
2. No import cycle between the project's modules (imports inside functions count too).
3. ``workers/`` imports nothing from ``services/``.
4. Only boundaries open a unit of work: ``unit_of_work`` is imported by the API and CLI
   (``services/``), the tasks (``workers/``) and the offline applications (``evaluation/``,
   ``training/``), never by ``shared/`` (``shared/db`` defines it).
5. Every API route declares a response model (or answers 204 with no body).
6. No import cycle between the packages of ``shared/`` either (``shared.search`` and
   ``shared.stores`` as wholes): each package sits on the ones below it, so a newcomer can
   read them bottom up (stores, tenants, documents, ingest, relay, search, reconcile, ...).
7. Only ``shared/stores`` imports the Elasticsearch client: its adapters raise Concord's
   store errors (shared/errors.StoreError) instead of the driver's, and callers catch those.
8. No module constructs a store adapter (``ElasticsearchChunkIndex``, ``PgVectorStore``, the
   task queue's ``CeleryQueue``, the in-memory ones) but ``shared/stores/compose.py`` and the
   adapter's own module: the
   composition roots (the API app, the worker, the CLI, evaluation, training) call
   ``compose.connect`` and every service and stage receives the stores it uses.
9. No stage of the query path imports another stage's module: each takes values and returns
   values (``shared/search/values.py``), and ``shared/search/service.py`` alone runs them in
   order; what two stages share (the per-document cap, the passage matcher) is a module of
   its own.

Prints each violation and exits 1 if there is any.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("shared", "services", "workers", "evaluation", "training")
STATEMENTS = {"select", "insert", "update", "delete", "text"}
RUNS_SQL = {"execute", "scalar", "scalars"}
SESSION_SQL = {"add", "get", "delete", "merge"}


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _is_session(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == "session") or (
        isinstance(node, ast.Attribute) and node.attr == "session"
    )


def _is_redis_pipeline(node: ast.expr) -> bool:
    """A Redis pipeline's ``execute`` is not SQL: a name ``pipe`` (or ``*_pipe``) holds one."""
    return isinstance(node, ast.Name) and (node.id == "pipe" or node.id.endswith("_pipe"))


def sql_outside_repositories(path: Path, tree: ast.AST) -> list[str]:
    if path.name == "repository.py":
        return []
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sqlalchemy"):
            for alias in node.names:
                if alias.name in STATEMENTS:
                    problems.append(f"{path}:{node.lineno}: imports {alias.name} from SQLAlchemy")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            attr = node.func.attr
            if (attr in RUNS_SQL and not _is_redis_pipeline(node.func.value)) or (
                attr in SESSION_SQL and _is_session(node.func.value)
            ):
                problems.append(f"{path}:{node.lineno}: runs SQL ({attr})")
    return problems


def imports_of(name: str, tree: ast.AST, known: dict[str, Path]) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        found |= {t for t in targets if t in known and t != name}
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in graph:
        if v not in index:
            visit(v)
    return found


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph folded into ``shared/``'s packages (modules such as shared.settings,
    below every package, drop out)."""

    def package(module: str) -> str | None:
        parts = module.split(".")
        if parts[0] != "shared" or len(parts) < 2:
            return None
        return parts[1] if (ROOT / "shared" / parts[1]).is_dir() else None

    folded: dict[str, set[str]] = {}
    for module, targets in graph.items():
        source = package(module)
        if source is None:
            continue
        folded.setdefault(source, set())
        for target in targets:
            into = package(target)
            if into is not None and into != source:
                folded[source].add(into)
                folded.setdefault(into, set())
    return folded


def routes_without_models(path: Path, tree: ast.AST) -> list[str]:
    problems = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for decorator in node.decorator_list:
            if not (
                isinstance(decorator, ast.Call)
                and isinstance(decorator.func, ast.Attribute)
                and decorator.func.attr in {"get", "post", "put", "patch", "delete"}
            ):
                continue
            keywords = {k.arg: k.value for k in decorator.keywords}
            no_body = isinstance(keywords.get("status_code"), ast.Constant) and (
                keywords["status_code"].value == 204  # type: ignore[attr-defined]
            )
            hidden = isinstance(keywords.get("include_in_schema"), ast.Constant)
            returns = ast.unparse(node.returns) if node.returns else ""
            declared = "response_model" in keywords or (
                returns and returns not in {"None", "Response", "JSONResponse", "dict[str, Any]"}
            )
            if not (declared or no_body or hidden):
                problems.append(f"{path}:{node.lineno}: route {node.name} has no response model")
    return problems


def imports_elasticsearch(path: Path, tree: ast.AST) -> list[str]:
    if path.parts[:2] == ("shared", "stores"):
        return []
    return [
        f"{path}:{node.lineno}: imports the Elasticsearch client outside shared/stores"
        for node in ast.walk(tree)
        if (
            isinstance(node, ast.ImportFrom)
            and (node.module or "").split(".")[0] == "elasticsearch"
        )
        or (
            isinstance(node, ast.Import)
            and any(a.name.split(".")[0] == "elasticsearch" for a in node.names)
        )
    ]


ADAPTERS = {"ElasticsearchChunkIndex", "PgVectorStore", "RedisSnapshots", "CeleryQueue",
            "PgCachedEmbeddings", "MemoryChunkIndex", "MemoryVectorStore", "MemorySnapshots",
            "MemoryQueue", "MemoryCachedEmbeddings"}  # fmt: skip
MAY_CONSTRUCT = {"shared.stores.compose", "shared.stores.chunk_index", "shared.stores.vector_store",
                 "shared.stores.snapshots", "shared.stores.embedding_cache", "shared.stores.memory",
                 "shared.queue"}  # fmt: skip


def may_construct(module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in MAY_CONSTRUCT)


def constructs_adapters(path: Path, tree: ast.AST) -> list[str]:
    return [
        f"{path}:{node.lineno}: constructs {node.func.id} (only the composition roots do, "
        "through shared/stores/compose.py)"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ADAPTERS
    ]


# The query path's stages, in the order service.py runs them.
STAGES = tuple(
    f"shared.search.{stage}"
    for stage in ("resolve", "retrieve", "fusion", "hydrate", "rerank", "diversify", "decide",
                  "respond")
)  # fmt: skip


def imports_another_stage(path: Path, name: str, imported: set[str]) -> list[str]:
    """A stage's imports of another stage's module (or of a name from one)."""
    if name not in STAGES:
        return []
    return [
        f"{path}: imports the stage {target} (stages exchange values; service.py runs them)"
        for target in sorted(imported)
        if target in STAGES or target.rsplit(".", 1)[0] in STAGES
    ]


def _opens_uow(tree: ast.AST) -> bool:
    return any(
        isinstance(n, ast.ImportFrom)
        and n.module == "shared.db"
        and any(a.name == "unit_of_work" for a in n.names)
        for n in ast.walk(tree)
    )


def main() -> int:
    known = modules()
    trees = {name: ast.parse(path.read_text(), str(path)) for name, path in known.items()}
    problems: list[str] = []
    graph = {name: imports_of(name, tree, known) for name, tree in trees.items()}
    for name, tree in trees.items():
        path = known[name].relative_to(ROOT)
        problems += sql_outside_repositories(path, tree)
        problems += imports_elasticsearch(path, tree)
        if not may_construct(name):
            problems += constructs_adapters(path, tree)
        if name.startswith("workers"):
            problems += [f"{path}: imports {t}" for t in graph[name] if t.startswith("services")]
        if name.startswith("shared.") and not name.startswith("shared.db") and _opens_uow(tree):
            problems.append(f"{path}: opens a unit of work (only boundaries may)")
        problems += imports_another_stage(path, name, graph[name])
        if name.startswith("services.api.routes"):
            problems += routes_without_models(path, tree)
    problems += [f"import cycle: {' -> '.join(c)}" for c in cycles(graph)]
    problems += [f"package import cycle: {' -> '.join(c)}" for c in cycles(package_graph(graph))]
    for problem in problems:
        print(problem)
    print(f"{len(known)} modules checked, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
