"""Ingest claims interleave tenants: a small upload is claimed in the next batch, whatever
another tenant has queued before it. Against the real Postgres, in a transaction that is
rolled back (the running worker never sees these jobs)."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from sqlalchemy import update

from shared.db import unit_of_work
from shared.documents.schemas import Upload
from shared.documents.service import accept_uploads
from shared.jobs import repository as jobs_repo
from shared.models import IngestJob
from shared.settings import get_settings


class RolledBack(Exception):
    pass


def test_claims_take_tenants_round_robin_so_a_backlog_does_not_hold_up_a_small_upload(
    tenant: str,
) -> None:
    backlog, small = f"{tenant}-backlog", f"{tenant}-small"
    settings = get_settings()
    with pytest.raises(RolledBack), unit_of_work() as uow:
        uploads = [Upload(backlog, f"doc-{i}", f"backlog {i}".encode(), "text/plain")
                   for i in range(40)]  # fmt: skip
        uploads += [Upload(small, f"doc-{i}", f"small {i}".encode(), "text/plain") for i in (1, 2)]
        accept_uploads(uow, settings, uploads)
        # the small tenant's jobs are the newest: strictly after the whole backlog
        uow.session.execute(
            update(IngestJob)
            .where(IngestJob.tenant_id == small)
            .values(created_at=IngestJob.created_at + timedelta(seconds=1))
        )
        claimed = jobs_repo.claim_queued_jobs(uow.session, 10, uuid.uuid4(), 10**9, 2)
        tenants = [job.tenant_id for job in claimed if job.tenant_id in (backlog, small)]
        raise RolledBack
    # Other tests' tenants may have jobs queued in this database too: they take their turns
    # in the round robin as well, and the backlog the rest of the batch.
    others = len(claimed) - len(tenants)
    assert len(claimed) == 10
    assert tenants.count(small) == 2, tenants  # both in the first batch
    assert tenants.count(backlog) == 8 - others
    # interleaved: each tenant's first job before any tenant's second
    assert tenants.index(small) < 3, tenants


def test_a_claim_stays_within_its_byte_budget_in_round_robin_order(tenant: str) -> None:
    settings = get_settings()
    with pytest.raises(RolledBack), unit_of_work() as uow:
        uploads = [Upload(f"{tenant}-{t}", f"doc-{i}", b"x" * 1000, "text/plain")
                   for i in range(5) for t in "ab"]  # fmt: skip
        accept_uploads(uow, settings, uploads)
        claimed = jobs_repo.claim_queued_jobs(uow.session, 32, uuid.uuid4(), 3500, 2)
        ours = [j for j in claimed if j.tenant_id.startswith(tenant)]
        raise RolledBack
    assert len(ours) <= 3  # 1,000 bytes each, 3,500 in all (other tenants' queued jobs count too)
