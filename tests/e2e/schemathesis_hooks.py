"""schemathesis hooks for tests/e2e/test_schemathesis.py (loaded through ``SCHEMATHESIS_HOOKS``).

One false positive of the negative-data check (ST201) is dropped, and only that one. A
multipart form carries nothing but text, so when schemathesis mutates a form field's type
(the title becomes the number ``-1.16e-293``) the wire carries the text ``-1.16e-293``: a valid
title, rightly accepted. schemathesis tries to recognise such wire-identical mutations
itself, but its check gives up on any form with a file part (its validator cannot read the
file's bytes), so every upload whose only mutation vanished on the wire is reported.

The hook reads the request as the server read it, every part as text, and drops the
failure only if that request satisfies the schema. A form that really breaks the schema
(a 1,001-character title, a missing file) still fails the run.
"""

from __future__ import annotations

from collections.abc import Mapping
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any

import jsonschema_rs
import schemathesis
from schemathesis.core.failures import AcceptedNegativeData, Failure
from schemathesis.core.parameters import ParameterLocation
from schemathesis.core.transport import Response
from schemathesis.generation.case import Case

MULTIPART = "multipart/form-data"


def multipart_fields(body: bytes, content_type: str) -> dict[str, list[str]]:
    """Every part of a multipart body as text, files included, by field name."""
    message = BytesParser(policy=HTTP).parsebytes(
        f"Content-Type: {content_type}\r\n\r\n".encode() + body
    )
    fields: dict[str, list[str]] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        if isinstance(name, str) and isinstance(payload, bytes):
            fields.setdefault(name, []).append(payload.decode(errors="replace"))
    return fields


def form_as_sent_is_valid(body: bytes, content_type: str, schema: Mapping[str, Any]) -> bool:
    """Whether the form that was sent satisfies ``schema``. Every value of a repeated field must
    be valid on its own, because which of them a server reads is the server's choice."""
    fields = multipart_fields(body, content_type)
    validator = jsonschema_rs.validator_for(dict(schema))
    first = {name: values[0] for name, values in fields.items()}
    return validator.is_valid(first) and all(
        validator.is_valid({**first, name: value})
        for name, values in fields.items()
        for value in values[1:]
    )


@schemathesis.hook
def filter_failure(context: Any, failure: Failure, case: Case[Any], response: Response) -> bool:
    """Keep every failure except ST201 on a multipart form that was valid as sent."""
    if not isinstance(failure, AcceptedNegativeData) or case.media_type != MULTIPART:
        return True
    meta = case.meta
    negated_elsewhere = meta is None or any(
        meta.is_negative_at(location)
        for location in ParameterLocation
        if location is not ParameterLocation.BODY
    )
    body_schema = case.operation.get_body_for_media_type(MULTIPART)
    sent = response.request.body
    if isinstance(sent, str):
        sent = sent.encode()
    if negated_elsewhere or body_schema is None or not isinstance(sent, bytes):
        return True
    content_type = response.request.headers.get("Content-Type", "")
    if isinstance(content_type, bytes):
        content_type = content_type.decode("latin-1")
    return not form_as_sent_is_valid(sent, content_type, body_schema.optimized_schema)
