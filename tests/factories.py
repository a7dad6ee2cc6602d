"""Rows written through the repositories and store adapters, for tests that need indexed
chunks but not the worker: no queue, no pipeline, no relay, so no waiting either.

``indexed_notes`` writes what an ingest and its relay would have left behind for one-chunk
documents: the tenant, each document at version 1, its chunk with the real encoder's vector in
Postgres (PgVectorStore), and the chunk's copy in Elasticsearch (as the relay writes it, the
version as an external version), searchable at once."""

from __future__ import annotations

import hashlib
import uuid

from shared.db import unit_of_work
from shared.documents import repository as documents_repo
from shared.ingest.embedding import get_embedder
from shared.models import Document
from shared.stores.chunk_index import ElasticsearchChunkIndex
from shared.stores.schemas import ChunkRow, VersionChunks, chunk_id
from shared.stores.vector_store import PgVectorStore
from shared.tenants import repository as tenants_repo


def indexed_notes(tenant_id: str, texts: list[str], title: str = "") -> list[str]:
    """One document per text (external id ``note-<i>``), each one chunk; returns their ids."""
    vectors = get_embedder().embed_passages(texts)
    versions, documents = [], []
    for i, (text, vector) in enumerate(zip(texts, vectors, strict=True)):
        document = Document(
            id=uuid.uuid4(),
            tenant_id=tenant_id,
            external_id=f"note-{i}",
            title=title,
            metadata_={},
            version=1,
            content_hash=hashlib.sha256(text.encode()).hexdigest(),
            deleted=False,
        )
        row = ChunkRow(
            id=chunk_id(document.id, 0),
            ordinal=0,
            text=text,
            text_hash=hashlib.sha256(text.encode()).hexdigest(),
            char_start=0,
            char_end=len(text),
            section="",
            token_count=len(text.split()),
            embedding=vector,
        )
        documents.append(document)
        versions.append(
            VersionChunks(tenant_id, document.id, 1, document.external_id, title, {}, [row])
        )
    with unit_of_work() as uow:
        tenants_repo.ensure_tenants(uow.session, [tenant_id])
        for document in documents:
            documents_repo.add_document(uow.session, document)
        uow.session.flush()
        PgVectorStore(uow.session).upsert(versions)
    ids = [v.rows[0].id for v in versions]
    with unit_of_work() as uow:
        chunks = PgVectorStore(uow.session).chunks_by_ids(ids)
        by_id = documents_repo.documents_by_ids(uow.session, [d.id for d in documents])
        copies = [(chunks[cid], by_id[chunks[cid].document_id]) for cid in ids]
    index = ElasticsearchChunkIndex()
    assert set(index.write(copies, "external")) == {201}
    index.refresh(tenant_id)
    return ids
