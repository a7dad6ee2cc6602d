"""The layout's rules (scripts/check_layout.py) hold for the tree, and each check catches what
it is for."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_layout", ROOT / "scripts/check_layout.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_tree_keeps_every_rule() -> None:
    result = subprocess.run(
        [sys.executable, "scripts/check_layout.py"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout
    assert " 0 problems" in result.stdout


def test_each_check_catches_its_violation() -> None:
    check = _checker()
    service = ast.parse(
        "from sqlalchemy import select\n"
        "def f(session):\n    session.add(1)\n    return session.execute(select(1))\n"
    )
    assert len(check.sql_outside_repositories(Path("shared/x/service.py"), service)) == 3
    assert check.sql_outside_repositories(Path("shared/x/repository.py"), service) == []
    assert check.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    # modules without a cycle whose packages form one: search.x -> stores.y -> search.z
    modules = {
        "shared.search.x": {"shared.stores.y"},
        "shared.stores.y": {"shared.search.z", "shared.settings"},
        "shared.search.z": set(),
        "shared.settings": set(),
    }
    assert check.cycles(modules) == []
    assert check.cycles(check.package_graph(modules)) == [["search", "stores"]]
    routes = ast.parse(
        "@router.get('/x')\ndef untyped() -> dict[str, Any]: ...\n"
        "@router.get('/y')\ndef typed() -> Thing: ...\n"
        "@router.post('/z', response_model=Thing)\ndef declared() -> Response: ...\n"
        "@router.delete('/w', status_code=204)\ndef gone() -> None: ...\n"
    )
    [problem] = check.routes_without_models(Path("routes.py"), routes)
    assert "untyped" in problem
    driver = ast.parse("from elasticsearch import ApiError\nimport elasticsearch.helpers\n")
    assert len(check.imports_elasticsearch(Path("shared/search/retrieve.py"), driver)) == 2
    assert check.imports_elasticsearch(Path("shared/stores/elastic.py"), driver) == []
    stage, path = "shared.search.decide", Path("shared/search/decide.py")
    [problem] = check.imports_another_stage(
        path, stage, {"shared.search.hydrate.hydrate", "shared.search.values", "shared.settings"}
    )
    assert "shared.search.hydrate" in problem
    assert check.imports_another_stage(path, stage, {"shared.search.caps"}) == []
    assert check.imports_another_stage(Path("x.py"), "shared.search.service", {stage}) == []
    opens = ast.parse("from shared.db import UnitOfWork, unit_of_work\n")
    assert check._opens_uow(opens) and not check._opens_uow(ast.parse("from shared.db import x"))
