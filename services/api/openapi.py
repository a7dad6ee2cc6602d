"""The OpenAPI document as a reader of /docs needs it: each operation's summary is the first
sentence of its route's docstring (FastAPI's default is the function's name, "Search Route"),
and its error responses are those it can answer, following from its shape: a request body
can be unparseable (400), too large (413) or invalid (422); a path or query parameter invalid
(422); an object named in the path missing (404). A route declares any other error itself;
the errors every authenticated route can answer are declared per router (services/api/deps.py).
"""

from __future__ import annotations

import re
from typing import Any

from services.api.deps import BODY_ERRORS, INVALID_PARAMETER, NOT_FOUND
from shared.documents.schemas import TextDocument

_ERROR_SCHEMA = {"$ref": "#/components/schemas/ErrorBody"}
# Up to a full stop, or a colon or semicolon that ends a clause (not a JSON key's, '"a": 1').
_FIRST_SENTENCE = re.compile(r'^(.+?)(\.|(?<!")[:;])(\s|$)', re.DOTALL)


# The parameters' descriptions, by name: the same name means the same thing on every route.
PARAMETER_DESCRIPTIONS = {
    "document_id": "a document's id (from its upload's answer, or GET /v1/documents)",
    "job_id": "a job's id (from an upload's answer)",
    "letter_id": "a dead letter's id (GET /v1/admin/dead-letters)",
    "key_id": "an API key's id (GET /v1/admin/keys)",
    "endpoint_id": "a webhook endpoint's id (GET /v1/admin/webhooks)",
    "name": "the name it was saved or trained under",
    "limit": "how many at most",
    "after": "the last external id of the previous page: the page after it",
    "section": "only this section's chunks (a section path as results show it)",
    "state": "only jobs in this state",
    "stuck": "only queued or running jobs whose lease has expired",
    "include_deleted": "show a deleted document's tombstone instead of 404",
}


def summary_of(description: str) -> str:
    """The first sentence of a description, on one line, without RST literals' backquotes."""
    flat = " ".join(description.split()).replace("``", "")
    match = _FIRST_SENTENCE.match(flat)
    return match.group(1) if match else flat.rstrip(".")


def _response(error: dict[str, Any]) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": error["description"],
        "content": {"application/json": {"schema": _ERROR_SCHEMA}},
    }
    if "headers" in error:
        response["headers"] = error["headers"]
    return response


def describe_operations(schema: dict[str, Any]) -> dict[str, Any]:
    """Complete ``schema`` (FastAPI's) in place, as the module docstring says; returns it."""
    # The JSON upload's body, which the upload route reads itself (it takes multipart too).
    schema.setdefault("components", {}).setdefault("schemas", {})["TextDocument"] = (
        TextDocument.model_json_schema()
    )
    for path, operations in schema.get("paths", {}).items():
        if not path.startswith("/v1/"):
            continue
        for method, operation in operations.items():
            if operation.get("description"):
                operation["summary"] = summary_of(operation["description"])
            parameters = operation.get("parameters", [])
            for parameter in parameters:
                if parameter["name"] in PARAMETER_DESCRIPTIONS:
                    parameter.setdefault("description", PARAMETER_DESCRIPTIONS[parameter["name"]])
            errors: dict[int | str, dict[str, Any]] = {}
            if "requestBody" in operation:
                errors |= BODY_ERRORS
            if any(p["in"] in ("path", "query") for p in parameters):
                errors |= INVALID_PARAMETER
            if any(p["in"] == "path" for p in parameters) and method != "put":
                errors |= NOT_FOUND  # a PUT makes what it names
            responses = operation.setdefault("responses", {})
            # FastAPI's own 422 describes its validation error model; Concord answers with
            # its error body (or, without parameters or body, cannot answer 422 at all).
            responses.pop("422", None)
            for status, error in errors.items():
                responses.setdefault(str(status), _response(error))
            operation["responses"] = dict(sorted(responses.items()))
    return schema
