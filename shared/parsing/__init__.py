"""Turn an upload's bytes into text plus the section (heading path) and flags of every span of
it: one module per format, one table of them (``registry.FORMATS``).

A parse failure raises ``ParseError`` with a reason a person can act on; retrying won't help.
"""

from shared.parsing.document import (
    CODE,
    DOUBTFUL_EXTRACTION,
    TABLE,
    ParsedDocument,
    ParseOptions,
    Section,
)
from shared.parsing.json_records import MAX_JSON_RECORDS, jsonl_line_count
from shared.parsing.registry import (
    EXTENSIONS,
    FORMATS,
    SUPPORTED_TYPES,
    options_from,
    parse,
    resolve_content_type,
    supported_list,
)

__all__ = [
    "CODE",
    "DOUBTFUL_EXTRACTION",
    "EXTENSIONS",
    "FORMATS",
    "MAX_JSON_RECORDS",
    "SUPPORTED_TYPES",
    "TABLE",
    "ParseOptions",
    "ParsedDocument",
    "Section",
    "jsonl_line_count",
    "options_from",
    "parse",
    "resolve_content_type",
    "supported_list",
]
