"""The OpenAPI document read as a new user reads /docs. Summaries were the function
names ("Search Route"), request fields had no descriptions, Decision.reason was a free string
and every route listed the same errors (413 on GETs)."""

from __future__ import annotations

from typing import Any

import pytest

from services.api.app import create_app
from services.api.openapi import summary_of

PROTECTED = {"401", "403", "429", "503"}


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return create_app().openapi()


def _operations(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method, path, operation)
        for path, item in schema["paths"].items()
        if path.startswith("/v1/")
        for method, operation in item.items()
    ]


def test_every_operation_has_a_summary_and_a_description(schema: dict[str, Any]) -> None:
    for method, path, operation in _operations(schema):
        where = f"{method.upper()} {path}"
        assert operation.get("description"), where
        summary = operation["summary"]
        assert not summary.endswith("Route") and 0 < len(summary) <= 120, (where, summary)
        assert " ".join(operation["description"].split()).replace("``", "").startswith(summary)
    assert summary_of("Run it again. Then more.") == "Run it again"
    assert summary_of('The next "paginate": true page; or not') == 'The next "paginate": true page'


def test_every_request_field_and_parameter_is_described(schema: dict[str, Any]) -> None:
    components = schema["components"]["schemas"]
    undescribed: list[str] = []
    seen: set[str] = set()

    def visit(node: Any, where: str) -> None:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if ref:
                name = ref.rsplit("/", 1)[-1]
                if name not in seen:
                    seen.add(name)
                    visit(components[name], name)
                return
            for field, spec in node.get("properties", {}).items():
                if "description" not in spec:
                    undescribed.append(f"{where}.{field}")
                visit(spec, f"{where}.{field}")
            for key in ("anyOf", "oneOf", "allOf", "items", "additionalProperties"):
                visit(node.get(key), where)
        elif isinstance(node, list):
            for item in node:
                visit(item, where)

    for method, path, operation in _operations(schema):
        for media in operation.get("requestBody", {}).get("content", {}).values():
            visit(media["schema"], f"{method.upper()} {path}")
        for parameter in operation.get("parameters", []):
            if parameter["in"] in ("path", "query") and not parameter.get("description"):
                undescribed.append(f"{method.upper()} {path} ?{parameter['name']}")
    assert "SearchRequest" in seen and "TextDocument" not in undescribed
    assert undescribed == []


def test_decision_and_omission_reasons_are_enumerated(schema: dict[str, Any]) -> None:
    components = schema["components"]["schemas"]

    def enum_of(spec: dict[str, Any]) -> set[str]:
        return {v for option in spec.get("anyOf", [spec]) for v in option.get("enum", [])}

    decision = enum_of(components["Decision"]["properties"]["reason"])
    assert {"no_hits", "query_terms_absent", "evidence_does_not_cover_query"} <= decision
    assert {"partial_coverage", "uncertain_answerability"} <= decision
    omission = enum_of(components["Omission"]["properties"]["reason"])
    assert {"over_budget", "near_duplicate", "below_threshold"} <= omission


def test_each_operation_lists_the_errors_it_can_answer(schema: dict[str, Any]) -> None:
    for method, path, operation in _operations(schema):
        where = f"{method.upper()} {path}"
        codes = set(operation["responses"])
        parameters = {p["in"] for p in operation.get("parameters", [])}
        has_body = "requestBody" in operation
        assert codes >= PROTECTED, where
        assert ("413" in codes) == has_body and (not has_body or "400" in codes), where
        assert ("422" in codes) == (has_body or bool(parameters & {"path", "query"})), where
        if "path" in parameters and method != "put":
            assert "404" in codes, where
        for code, response in operation["responses"].items():
            if code.startswith(("4", "5")):
                content = response["content"]["application/json"]["schema"]
                assert content == {"$ref": "#/components/schemas/ErrorBody"}, (where, code)
    search = schema["paths"]["/v1/search"]["post"]["responses"]
    assert {"404", "409"} <= set(search)
    assert "409" not in schema["paths"]["/v1/profiles"]["get"]["responses"]
