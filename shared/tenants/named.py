"""A tenant's named things of one kind: search profiles, trained rerankers, answerability
models. Every lookup is by the caller's tenant and the name, so no tenant reads, selects or
deletes another's; one class serves the three registries (profiles.py, rerankers/service.py,
answerability/service.py), which add only what their kind holds."""

from __future__ import annotations

from typing import Generic

from sqlalchemy.orm import Session

from shared.errors import NotFound
from shared.tenants import repository as repo
from shared.tenants.repository import Named


class NamedRegistry(Generic[Named]):
    def __init__(self, model: type[Named], kind: str) -> None:
        self.model: type[Named] = model
        self.kind = kind  # in the 404's message: "no search profile 'fast'"

    def find(self, session: Session, tenant_id: str, name: str) -> Named | None:
        return repo.named_row(session, self.model, tenant_id, name)

    def get(self, session: Session, tenant_id: str, name: str) -> Named:
        """The tenant's row called ``name``, or 404 "no <kind> '<name>'"."""
        row = self.find(session, tenant_id, name)
        if row is None:
            raise NotFound(f"no {self.kind} {name!r}")
        return row

    def list(self, session: Session, tenant_id: str) -> list[Named]:
        """The tenant's rows, by name."""
        return repo.named_rows(session, self.model, tenant_id)

    def for_writing(self, session: Session, tenant_id: str, name: str) -> Named:
        """The tenant's row called ``name`` to set the fields of, added if it is new (with
        the tenant, if that is new too)."""
        repo.ensure_tenant(session, tenant_id)
        return repo.named_row_or_new(session, self.model, tenant_id, name)

    def delete(self, session: Session, tenant_id: str, name: str) -> Named:
        """Remove the tenant's row called ``name`` (404 if there is none); returns it, for
        what the caller cleans up after commit (a reranker's files)."""
        row = self.get(session, tenant_id, name)
        repo.delete_named_row(session, row)
        return row
