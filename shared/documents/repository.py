"""All SQL of documents and their versions (tombstones included). Functions take a session and
never commit."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Select, select, tuple_
from sqlalchemy.orm import Session

from shared.db import any_of, starts_with
from shared.models import Document, DocumentVersion
from shared.stores.schemas import document_id_of


def documents_by_external_ids(
    session: Session, keys: Sequence[tuple[str, str]], for_update: bool = False
) -> dict[tuple[str, str], Document]:
    """The documents of (tenant id, external id) pairs that exist, by pair; with
    ``for_update``, locked in id order until commit."""
    if not keys:
        return {}
    query = select(Document).where(tuple_(Document.tenant_id, Document.external_id).in_(set(keys)))
    if for_update:
        query = _locking(query.order_by(Document.id))
    found = session.scalars(query)
    return {(d.tenant_id, d.external_id): d for d in found}


def document_for_tenant(
    session: Session, tenant_id: str, document_id: uuid.UUID, for_update: bool = False
) -> Document | None:
    query = select(Document).where(Document.id == document_id, Document.tenant_id == tenant_id)
    return session.scalar(_locking(query) if for_update else query)


def _locking(query: Select[Document]) -> Select[Document]:
    """FOR UPDATE, and the rows as they are once locked: a document this session read before
    (unlocked, while it waited for a key) would otherwise come back as it was then, a delete
    committed meanwhile unseen."""
    return query.with_for_update().execution_options(populate_existing=True)


def documents_by_ids(session: Session, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Document]:
    if not ids:
        return {}
    return {d.id: d for d in session.scalars(select(Document).where(any_of(Document.id, ids)))}


def list_documents(
    session: Session, tenant_id: str, limit: int, after: str | None = None, deleted: bool = False
) -> Sequence[Document]:
    """The tenant's live documents (or with ``deleted`` its tombstones) in external-id order,
    ``limit`` after ``after``."""
    query = (
        select(Document)
        .where(Document.tenant_id == tenant_id, Document.deleted.is_(deleted))
        .order_by(Document.external_id)
        .limit(limit)
    )
    if after is not None:
        query = query.where(Document.external_id > after)
    return session.scalars(query).all()


def versions(
    session: Session, keys: Sequence[tuple[uuid.UUID, int]]
) -> dict[tuple[uuid.UUID, int], DocumentVersion]:
    """(document id, version) -> that document version (raw content included), in one query."""
    wanted = set(keys)
    if not wanted:
        return {}
    rows = session.scalars(
        select(DocumentVersion).where(
            tuple_(DocumentVersion.document_id, DocumentVersion.version).in_(list(wanted))
        )
    )
    return {(v.document_id, v.version): v for v in rows}


def list_versions(session: Session, document_id: uuid.UUID) -> Sequence[Any]:
    return session.execute(
        select(
            DocumentVersion.version,
            DocumentVersion.content_hash,
            DocumentVersion.tombstone,
            DocumentVersion.created_at,
        )
        .where(DocumentVersion.document_id == document_id)
        .order_by(DocumentVersion.version)
    ).all()


def document_versions_for_chunks(
    session: Session, ids: Sequence[str]
) -> dict[str, tuple[uuid.UUID, int]]:
    """chunk id -> (document id, the document's current version), for documents we know."""
    doc_ids = {document_id_of(cid) for cid in ids}
    rows = session.execute(
        select(Document.id, Document.version).where(any_of(Document.id, doc_ids))
    )
    current = {doc_id: version for doc_id, version in rows}
    return {
        cid: (document_id_of(cid), current[document_id_of(cid)])
        for cid in ids
        if document_id_of(cid) in current
    }


def add_document(session: Session, doc: Document) -> None:
    session.add(doc)


def add_version(session: Session, version: DocumentVersion) -> None:
    session.add(version)


def live_content_hashes(
    session: Session, tenant_id: str, prefix: str, among: Sequence[str] | None = None
) -> dict[str, str]:
    """External id -> content hash of the tenant's live documents whose external id starts
    with ``prefix`` (and, given ``among``, is one of those)."""
    query = select(Document.external_id, Document.content_hash).where(
        Document.tenant_id == tenant_id,
        Document.deleted.is_(False),
        starts_with(Document.external_id, prefix),
    )
    if among is not None:
        query = query.where(any_of(Document.external_id, among))
    rows = session.execute(query)
    return {external_id: digest for external_id, digest in rows}
