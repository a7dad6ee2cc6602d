"""The shapes of the documents domain: the limits every way in states and checks, an upload as
intake sees it, and the API's request and response bodies."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.fields import METADATA_KEY, ReadableName
from shared.jobs.schemas import IngestJobView
from shared.schemas import Timestamp

# What the API's OpenAPI schema and docs/upload-event.schema.json publish, for every way in.
MAX_EXTERNAL_ID_CHARS = 512
MAX_TITLE_CHARS = 1000
# Metadata is copied into every chunk, in both stores: bounded per document.
MAX_METADATA_KEYS = 64
MAX_METADATA_BYTES = 16 * 1024  # as compact JSON
MAX_METADATA_LIST = 100  # values in one list
MAX_EXACT_INT = 2**53  # what a double (Elasticsearch's number) holds exactly


@dataclass(frozen=True)
class Upload:
    tenant_id: str
    external_id: str
    raw: bytes
    content_type: str
    title: str = ""
    filename: str | None = None
    metadata: dict[str, Any] | None = None


@dataclass(frozen=True)
class UploadResult:
    document_id: uuid.UUID
    version: int
    job_id: uuid.UUID | None
    status: Literal["accepted", "unchanged"]


# ------------------------------------------------------------------ the API's bodies

METADATA_SCALARS: list[Any] = [
    {"type": "string"},
    {"type": "number"},
    {"type": "boolean"},
    {"type": "null"},
]


class TextDocument(BaseModel):
    """The JSON form of an upload; files go as multipart/form-data instead. A field this
    schema does not name is refused (422), so a misspelt ``metdata`` is never lost quietly."""

    model_config = ConfigDict(extra="forbid")

    external_id: ReadableName = Field(
        min_length=1,
        max_length=MAX_EXTERNAL_ID_CHARS,
        description="the caller's name for the document: the same id again is a new version",
    )
    text: str = Field(min_length=1, description="the content")
    title: ReadableName = Field(
        default="", max_length=MAX_TITLE_CHARS, description="shown in results"
    )
    content_type: str = Field(
        default="text/plain",
        description="how to read text: text/plain, text/markdown, text/html, application/json, "
        "text/csv, ... (binary formats such as docx or PDF: upload the file as multipart)",
    )
    # Checked by check_metadata (for every way in); the schema states the same bounds.
    metadata: dict[str, Any] = Field(
        default_factory=dict,
        description="filterable values per key (scalars or lists of scalars)",
        json_schema_extra={
            "maxProperties": MAX_METADATA_KEYS,
            "propertyNames": {"pattern": METADATA_KEY.pattern},
            "additionalProperties": {
                "anyOf": [
                    *METADATA_SCALARS,
                    {
                        "type": "array",
                        "items": {"anyOf": list(METADATA_SCALARS)},
                        "maxItems": MAX_METADATA_LIST,
                    },
                ]
            },
        },
    )


class UploadAccepted(BaseModel):
    """202 with the job that indexes the new version; 200 ``unchanged`` with the version's
    newest job when the same content was uploaded again."""

    document_id: uuid.UUID
    version: int
    job_id: uuid.UUID | None
    status: Literal["accepted", "unchanged"]


class DocumentSummary(BaseModel):
    id: uuid.UUID
    external_id: str
    title: str
    version: int = Field(description="the live version, or a deleted document's tombstone")
    deleted: bool = Field(description="true for a tombstone (listed with ?deleted=true)")
    updated_at: Timestamp = Field(description="when the document last changed or was deleted")


class DocumentList(BaseModel):
    documents: list[DocumentSummary]
    next_after: str | None = Field(description="pass as ``after`` for the next page")


class VersionView(BaseModel):
    version: int
    tombstone: bool
    created_at: Timestamp


class IndexState(BaseModel):
    """Whether Elasticsearch holds exactly the live version's chunks."""

    reachable: bool
    error: str | None = None
    chunks: int | None = None
    live_version_chunks: int | None = None
    in_sync: bool | None = None


class DocumentView(BaseModel):
    id: uuid.UUID
    external_id: str
    title: str
    metadata: dict[str, Any]
    version: int
    deleted: bool
    chunk_count: int
    versions: list[VersionView]
    elasticsearch: IndexState
    job: IngestJobView | None = Field(
        default=None,
        description="the live version's newest ingest job: its state, and where and why it "
        "failed when it did (a document whose job failed holds no chunks)",
    )


class ChunkView(BaseModel):
    chunk_id: str
    ordinal: int
    section: str
    text: str
    char_start: int
    char_end: int


class ChunkList(BaseModel):
    document_id: uuid.UUID
    version: int
    section: str | None
    chunks: list[ChunkView]


class DocumentDeleted(BaseModel):
    document_id: uuid.UUID
    version: int = Field(description="the tombstone's version")
    deleted: bool
