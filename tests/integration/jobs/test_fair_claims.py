"""Ingest batches are the next work in fair order over tenants, by bytes: a small upload is
claimed in the next batch whatever another tenant has queued before it, in any mix of sizes.
Against the real Postgres, in a transaction that is rolled back (the running worker never sees
these jobs)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import update

from shared.db import unit_of_work
from shared.documents.schemas import Upload
from shared.documents.service import accept_uploads
from shared.jobs import repository as jobs_repo
from shared.models import IngestJob
from shared.settings import get_settings

BATCH_BYTES = 256 * 1024  # the shipped ingest_batch_bytes


class RolledBack(Exception):
    pass


def _claim(tenant: str, uploads: list[Upload], later: str, limit: int = 32) -> list[str]:
    """Accept ``uploads``, make ``later``'s jobs the newest, claim one batch; the tenants
    of the claimed jobs of this test, in claim order."""
    settings = get_settings()
    with pytest.raises(RolledBack), unit_of_work() as uow:
        accept_uploads(uow, settings, uploads)
        uow.session.execute(
            update(IngestJob)
            .where(IngestJob.tenant_id == later)
            .values(created_at=IngestJob.created_at + timedelta(seconds=1))
        )
        claimed = jobs_repo.claim_fair_batch(uow.session, limit, BATCH_BYTES, 2, 64)
        tenants = [job.tenant_id for job in claimed if job.tenant_id.startswith(tenant)]
        raise RolledBack
    return tenants


def test_a_backlog_of_ordinary_documents_does_not_keep_a_small_upload_out(tenant: str) -> None:
    """Before, one tenant's 160 documents of about 150 KB were queued before another's one
    line; the claim took the backlog's next job first, found it did not fit the room left,
    and stopped there, batch after batch (54 s to searchable against 3.4 s idle)."""
    flood, small = f"{tenant}-flood", f"{tenant}-small"
    uploads = [Upload(flood, f"doc-{i}", b"x" * 150_000, "text/plain") for i in range(12)]
    uploads.append(Upload(small, "note", b"The tide turns twice a day.", "text/plain"))
    tenants = _claim(tenant, uploads, later=small)
    assert small in tenants, tenants  # in the very next batch, beside one flood document
    # (other tests' queued jobs, in this database too, take their turns as well)
    assert tenants.count(flood) <= 1


def test_documents_larger_than_a_batch_still_leave_room_for_the_next_tenant(tenant: str) -> None:
    """30 documents of about 600 KB (each over the whole batch budget): each is a batch of
    its own, and the small upload is the next batch's first job, not the 31st's."""
    flood, small = f"{tenant}-flood", f"{tenant}-small"
    uploads = [Upload(flood, f"doc-{i}", b"y" * 600_000, "text/plain") for i in range(4)]
    uploads.append(Upload(small, "note", b"Feed the starter once a day.", "text/plain"))
    tenants = _claim(tenant, uploads, later=small)
    # one of the two comes first and fills the batch alone; the other is the next one's
    assert len(tenants) <= 1
    # with the flood's first document taken (running), the small tenant comes first
    settings = get_settings()
    with pytest.raises(RolledBack), unit_of_work() as uow:
        accept_uploads(uow, settings, uploads)
        uow.session.execute(
            update(IngestJob)
            .where(IngestJob.tenant_id == small)
            .values(created_at=IngestJob.created_at + timedelta(seconds=1))
        )
        first = jobs_repo.claim_fair_batch(uow.session, 32, BATCH_BYTES, 2, 64)
        assert [j.tenant_id for j in first if j.tenant_id.startswith(tenant)] == [flood]
        for job in first:
            job.state = "running"
            job.lease_expires_at = job.created_at + timedelta(days=1)
        uow.session.flush()
        second = jobs_repo.claim_fair_batch(uow.session, 32, BATCH_BYTES, 2, 64)
        ours = [j.tenant_id for j in second if j.tenant_id.startswith(tenant)]
        raise RolledBack
    assert ours and ours[0] == small, ours


def test_tenants_take_turns_by_bytes_not_by_jobs(tenant: str) -> None:
    """A tenant of small documents gets as many bytes as one of large documents, so many
    more documents: the batch fills with both, the small ones first."""
    large, many = f"{tenant}-large", f"{tenant}-many"
    uploads = [Upload(large, f"doc-{i}", b"l" * 60_000, "text/plain") for i in range(6)]
    uploads += [Upload(many, f"doc-{i}", b"m" * 6_000, "text/plain") for i in range(30)]
    tenants = _claim(tenant, uploads, later=many)
    assert 1 <= tenants.count(large) <= 2, tenants
    assert tenants.count(many) >= 8 * tenants.count(large), tenants
