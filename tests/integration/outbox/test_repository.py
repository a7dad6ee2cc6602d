"""The outbox table's repository on the real Postgres: fair claims, postponement, counts.

Everything happens in one transaction that is rolled back: no relay of the suite's worker
ever sees these rows (they name no real chunk), and no other test's rows are touched."""

from __future__ import annotations

import uuid

from shared.db import unit_of_work
from shared.models import OutboxOp
from shared.outbox import repository as repo


def test_claims_take_tenants_in_turn_and_postponed_rows_wait() -> None:
    big, small = f"big-{uuid.uuid4().hex[:8]}", f"small-{uuid.uuid4().hex[:8]}"
    with unit_of_work() as uow:
        session = uow.session
        try:
            for tenant, count in ((big, 5), (small, 2)):
                repo.add_outbox(
                    session,
                    tenant_id=tenant,
                    document_id=uuid.uuid4(),
                    op=OutboxOp.INDEX,
                    version=1,
                    chunk_ids=[f"{tenant}:{i}" for i in range(count)],
                )
            assert (repo.outbox_backlog(session, big), repo.outbox_backlog(session, small)) == (
                5,
                2,
            )
            ours = {big, small}
            claimed = [r for r in repo.claim_outbox(session, 1000) if r.tenant_id in ours]
            # one tenant's backlog never holds up another's few rows: turns alternate
            assert [r.chunk_id for r in claimed] == [
                f"{big}:0", f"{small}:0", f"{big}:1", f"{small}:1", f"{big}:2", f"{big}:3",
                f"{big}:4",
            ]  # fmt: skip
            small_ids = [r.id for r in claimed if r.tenant_id == small]
            repo.postpone_outbox(session, small_ids, 60, "HTTP 429", count_attempt=True)
            session.expire_all()
            again = [r for r in repo.claim_outbox(session, 1000) if r.tenant_id in ours]
            assert {r.tenant_id for r in again} == {big}  # postponed rows are not due
            assert repo.due_outbox_rows_for(session, [f"{small}:0", f"{small}:1"]) == 0
            assert repo.due_outbox_rows_for(session, [f"{big}:0"]) == 1
            postponed = [r for r in claimed if r.tenant_id == small]
            assert [(r.attempts, r.last_error) for r in postponed] == [(1, "HTTP 429")] * 2
            queued = repo.chunks_with_queued_writes(session, [f"{small}:0", f"{big}:0", "x:0"])
            assert queued == {f"{small}:0", f"{big}:0"}
            assert repo.chunks_with_queued_writes(session, [f"{big}:0"], tenant_id=small) == set()
            repo.delete_outbox(session, [r.id for r in again])
            assert (repo.outbox_backlog(session, big), repo.outbox_backlog(session, small)) == (
                0,
                2,
            )
        finally:
            session.rollback()
