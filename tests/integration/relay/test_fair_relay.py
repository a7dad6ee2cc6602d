"""The outbox relay interleaves tenants: one tenant's 100,000 queued chunk writes never hold
up another's few. Against the real Postgres, in a transaction that is rolled back (the
running relay never sees these rows)."""

from __future__ import annotations

import uuid

import pytest

from shared.db import unit_of_work
from shared.models import OutboxOp
from shared.outbox import repository as repo


class RolledBack(Exception):
    pass


def test_a_relay_batch_takes_every_tenant_in_turn_not_the_oldest_rows_first(tenant: str) -> None:
    backlog, small = f"{tenant}-backlog", f"{tenant}-small"
    batch = 50
    with pytest.raises(RolledBack), unit_of_work() as uow:
        # the backlog's rows first (lower ids), then the small tenant's
        for who, count in ((backlog, 3 * batch), (small, 3)):
            repo.add_outbox_entries(
                uow.session,
                [
                    repo.OutboxEntry(
                        who, uuid.uuid4(), OutboxOp.INDEX, 1, [f"{who}:{i}" for i in range(count)]
                    )
                ],
            )
        claimed = repo.claim_outbox(uow.session, batch)
        tenants = [row.tenant_id for row in claimed]
        raise RolledBack
    assert len(claimed) == batch
    assert tenants.count(small) == 3, tenants  # all in the first batch
    assert tenants.count(backlog) == batch - 3 - sum(t not in (small, backlog) for t in tenants)
