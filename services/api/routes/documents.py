from __future__ import annotations

import json
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.datastructures import UploadFile

from services.api.deps import (
    PROTECTED_ROUTE_ERRORS,
    UPLOAD_ERRORS,
    Reader,
    SettingsDep,
    StoresDep,
    Writer,
)
from shared.db import unit_of_work
from shared.documents import repository as repo
from shared.documents.intake import check_upload, refuse_unstorable
from shared.documents.schemas import (
    MAX_EXTERNAL_ID_CHARS,
    MAX_TITLE_CHARS,
    ChunkList,
    ChunkView,
    DocumentDeleted,
    DocumentList,
    DocumentSummary,
    DocumentView,
    IndexState,
    TextDocument,
    Upload,
    UploadAccepted,
    UploadResult,
    VersionView,
)
from shared.documents.service import (
    accept_upload,
    admit_to_queue,
    delete_document,
    get_document,
)
from shared.errors import (
    BadRequest,
    InvalidRequest,
    PayloadTooLarge,
    StoreError,
    UnsupportedMediaType,
    validation_error,
)
from shared.fields import NO_NUL
from shared.jobs import repository as jobs_repo
from shared.jobs.service import ingest_job_view
from shared.parsing import resolve_content_type
from shared.queue import TaskQueue
from shared.settings import Settings
from shared.stores.ports import IndexHealth

router = APIRouter(prefix="/v1/documents", tags=["documents"], responses=PROTECTED_ROUTE_ERRORS)

MULTIPART_OVERHEAD = 64 * 1024


async def _read_body_limited(request: Request, limit: int) -> bytes:
    """Stream the body and stop as soon as it passes the limit (chunked uploads included)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"upload is {declared} bytes; the limit is {limit}")
    received = bytearray()
    async for piece in request.stream():
        received += piece
        if len(received) > limit:
            raise PayloadTooLarge(f"upload exceeds the limit of {limit} bytes")
    return bytes(received)


# The form fields of a multipart upload: any other is refused, never ignored.
FORM_FIELDS = frozenset({"file", "external_id", "title", "metadata"})


async def _upload_from_request(request: Request, tenant_id: str, settings: Settings) -> Upload:
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    limit = settings.max_upload_bytes
    if media_type == "application/json":
        body = await _read_body_limited(request, limit + MULTIPART_OVERHEAD)
        if not body.strip():
            raise BadRequest("empty request body")
        try:
            doc = TextDocument.model_validate_json(body)
        except ValidationError as e:  # the same status and words as any other body's schema
            # located as FastAPI locates a body's fields, so every route says "body.title"
            located = ({**err, "loc": ("body", *err["loc"])} for err in e.errors())
            raise validation_error(located) from e
        refuse_unstorable(doc.text, "text")
        raw = doc.text.encode()
        upload = Upload(
            tenant_id=tenant_id,
            external_id=doc.external_id,
            raw=raw,
            content_type=resolve_content_type(doc.content_type, None, raw),
            title=doc.title,
            metadata=doc.metadata,
        )
        await run_in_threadpool(check_upload, upload, settings)
        return upload
    if media_type == "multipart/form-data":
        request._body = await _read_body_limited(request, limit + MULTIPART_OVERHEAD)
        form = await request.form()
        unknown = sorted(set(form.keys()) - FORM_FIELDS)
        if unknown:  # a misspelt "extrnal_id" would have named the document after the file
            raise InvalidRequest(
                f"unknown form field(s) {', '.join(map(repr, unknown))}; an upload's fields "
                f"are {', '.join(sorted(FORM_FIELDS))}"
            )
        file = form.get("file")
        if not isinstance(file, UploadFile):
            raise BadRequest("multipart upload needs a 'file' part")
        raw = await file.read()
        if not raw:
            raise BadRequest("the uploaded file is empty")
        filename = file.filename or None
        external_id = str(form.get("external_id") or filename or "")
        if not external_id:
            raise BadRequest("external_id is required when the file has no name")
        upload = Upload(
            tenant_id=tenant_id,
            external_id=external_id,
            raw=raw,
            content_type=resolve_content_type(file.content_type, filename, raw),
            title=str(form.get("title") or ""),
            filename=filename,
            metadata=_metadata_field(form.get("metadata")),
        )
        await run_in_threadpool(check_upload, upload, settings)
        return upload
    raise UnsupportedMediaType(
        f"send application/json or multipart/form-data, not {media_type or 'nothing'!r}"
    )


def _metadata_field(value: object) -> dict[str, Any]:
    if value in (None, ""):
        return {}
    try:
        parsed = json.loads(str(value))
    except json.JSONDecodeError as e:
        raise BadRequest(f"metadata must be a JSON object: {e.msg}") from e
    except (ValueError, RecursionError) as e:  # over 4,300 digits; nested past the stack
        raise BadRequest(f"metadata is not JSON Concord can read: {type(e).__name__}") from e
    if not isinstance(parsed, dict):
        raise BadRequest("metadata must be a JSON object")
    return parsed


UPLOAD_REQUEST_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            # a component of its own (services/api/openapi.py): a client's models name it
            "application/json": {"schema": {"$ref": "#/components/schemas/TextDocument"}},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file"],
                    "properties": {
                        "file": {
                            "type": "string",
                            "format": "binary",
                            "minLength": 1,
                            "description": "the file; its type is read from its bytes and name",
                        },
                        "external_id": {
                            "type": "string",
                            "maxLength": MAX_EXTERNAL_ID_CHARS,
                            "description": "default: the file's name",
                        },
                        "title": {
                            "type": "string",
                            "maxLength": MAX_TITLE_CHARS,
                            "description": "shown in results",
                        },
                        "metadata": {"type": "string", "description": "a JSON object"},
                    },
                }
            },
        },
    }
}


@router.post(
    "",
    status_code=202,
    response_model=UploadAccepted,
    openapi_extra=UPLOAD_REQUEST_BODY,
    responses={
        200: {
            "description": "Unchanged content: nothing to index (a no-op)",
            "model": UploadAccepted,
        },
        **UPLOAD_ERRORS,
    },
)
async def upload_document(
    request: Request, principal: Writer, settings: SettingsDep, stores: StoresDep
) -> JSONResponse:
    """Upload a document (JSON or a multipart file) as a new version: 202 with its job, or 200
    when the content is unchanged. The content's type is read from its bytes; it is screened
    (PDFs open, no XML entities, bounded JSON) and stored before the answer, indexed after."""
    upload = await _upload_from_request(request, principal.tenant_id, settings)
    # The transaction (lock waits included) and the publish after it block: in a worker
    # thread, so that one slow upload does not stall every other request of this process.
    result = await run_in_threadpool(_accept, settings, upload, stores.queue)
    body = UploadAccepted(
        document_id=result.document_id,
        version=result.version,
        job_id=result.job_id,
        status=result.status,
    )
    return JSONResponse(
        body.model_dump(mode="json"), status_code=202 if result.status == "accepted" else 200
    )


def _accept(settings: Settings, upload: Upload, queue: TaskQueue) -> UploadResult:
    with unit_of_work() as uow:
        admit_to_queue(uow.session, upload, settings)
        return accept_upload(uow, settings, upload, queue=queue)


@router.get("")
def list_documents(
    principal: Reader,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    after: Annotated[str | None, Query(max_length=512, pattern=NO_NUL)] = None,
    deleted: Annotated[
        bool,
        Query(
            description="List the deleted documents (their tombstones: the id, the version "
            "the delete recorded, when) instead of the live ones"
        ),
    ] = False,
) -> DocumentList:
    """The caller's live documents by external id (or, with ``deleted=true``, its deleted
    ones); pass the last one as ``after`` for more."""
    with unit_of_work() as uow:
        docs = repo.list_documents(uow.session, principal.tenant_id, limit, after, deleted)
        items = [
            DocumentSummary(
                id=d.id,
                external_id=d.external_id,
                title=d.title,
                version=d.version,
                deleted=d.deleted,
                updated_at=d.updated_at,
            )
            for d in docs
        ]
    return DocumentList(
        documents=items, next_after=items[-1].external_id if len(items) == limit else None
    )


# Unset fields are left out: the index state carries ``error`` only when Elasticsearch is
# unreachable, and its counts only when it answered.
@router.get("/{document_id}", response_model_exclude_unset=True)
def read_document(
    document_id: uuid.UUID,
    principal: Reader,
    settings: SettingsDep,
    stores: StoresDep,
    include_deleted: bool = Query(
        False, description="Show a deleted document's tombstone and store state instead of 404"
    ),
) -> DocumentView:
    """One document: its versions, chunk count, whether Elasticsearch holds exactly the live
    version's chunks, and the live version's newest job (its state, and its error when it
    failed). A deleted document is 404 unless ``include_deleted``."""
    with unit_of_work() as uow:
        doc = get_document(uow.session, principal.tenant_id, document_id, include_deleted)
        versions = repo.list_versions(uow.session, doc.id)
        chunk_count = stores.vectors(uow.session).count_of_document(doc.id)
        job = None if doc.deleted else jobs_repo.newest_job(uow.session, doc.id, doc.version)
    return DocumentView(
        id=doc.id,
        external_id=doc.external_id,
        title=doc.title,
        metadata=doc.metadata_,
        version=doc.version,
        deleted=doc.deleted,
        chunk_count=chunk_count,
        versions=[
            VersionView(version=v.version, tombstone=v.tombstone, created_at=v.created_at)
            for v in versions
        ],
        elasticsearch=_index_state(stores.index, doc.tenant_id, doc.id, doc.version, chunk_count),
        job=None if job is None else ingest_job_view(job),
    )


def _index_state(
    index: IndexHealth, tenant_id: str, document_id: uuid.UUID, version: int, chunk_count: int
) -> IndexState:
    """Whether Elasticsearch holds exactly the live version's chunks."""
    try:
        total = index.count_of_document(tenant_id, str(document_id))
        current = index.count_of_document(tenant_id, str(document_id), version)
    except StoreError as e:  # the document view still answers when ES is down
        return IndexState(reachable=False, error=type(e).__name__)
    return IndexState(
        reachable=True,
        chunks=total,
        live_version_chunks=current,
        in_sync=total == current == chunk_count,
    )


@router.get("/{document_id}/chunks")
def browse_chunks(
    document_id: uuid.UUID,
    principal: Reader,
    stores: StoresDep,
    section: Annotated[str | None, Query(max_length=2000, pattern=NO_NUL)] = None,
) -> ChunkList:
    """Every chunk of the live version, in order (optionally one section): an exact lookup."""
    with unit_of_work() as uow:
        doc = get_document(uow.session, principal.tenant_id, document_id)
        chunks = stores.vectors(uow.session).document_chunks(principal.tenant_id, doc.id, section)
        return ChunkList(
            document_id=doc.id,
            version=doc.version,
            section=section,
            chunks=[
                ChunkView(
                    chunk_id=c.id,
                    ordinal=c.ordinal,
                    section=c.section,
                    text=c.text,
                    char_start=c.char_start,
                    char_end=c.char_end,
                )
                for c in chunks
            ],
        )


@router.delete("/{document_id}")
def remove_document(
    document_id: uuid.UUID, principal: Writer, stores: StoresDep
) -> DocumentDeleted:
    """Delete a document: a tombstone version is recorded at once, its chunks leave both
    stores after (listed with ``GET /v1/documents?deleted=true``)."""
    with unit_of_work() as uow:
        version = delete_document(
            uow, stores.vectors(uow.session), principal.tenant_id, document_id, queue=stores.queue
        )
    return DocumentDeleted(document_id=document_id, version=version, deleted=True)
