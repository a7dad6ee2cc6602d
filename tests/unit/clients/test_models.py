"""The client's models are the server's schemas: regenerated from today's OpenAPI document,
the committed module must come out the same (scripts/generate_client_models.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _generator():
    spec = importlib.util.spec_from_file_location(
        "generate_client_models", ROOT / "scripts" / "generate_client_models.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_client_models_are_generated_from_todays_openapi_document():
    generator = _generator()
    committed = generator.MODELS.read_text()
    assert committed == generator.generated_models(), (
        "the API's schemas changed: run python scripts/generate_client_models.py"
    )


def test_a_schema_change_on_the_server_is_drift(monkeypatch):
    """The check can fail: a field added to a response schema changes the generated module."""
    generator = _generator()
    real = generator.openapi_document

    def changed():
        document = real()
        schema = document["components"]["schemas"]["SearchResult"]
        schema["properties"]["new_field"] = {"type": "string", "title": "New Field"}
        schema["required"].append("new_field")
        return document

    monkeypatch.setattr(generator, "openapi_document", changed)
    assert "new_field" in generator.generated_models()
    assert "new_field" not in generator.MODELS.read_text()
