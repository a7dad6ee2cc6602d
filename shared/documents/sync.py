"""``concord sync``: what a directory needs sent so that a tenant's documents match it.

A file's external id is its path relative to the directory (after an optional prefix); it is
compared with the tenant's live documents by the content hash Concord itself keeps (bytes,
type, title, metadata: :func:`shared.documents.service.content_hash`), so only new and changed
files are sent, a second run sends nothing, and an interrupted run resumes by running again.
A file whose content already failed (its job failed, or its upload was refused at intake:
the refusal of content sent inline keeps the bytes' digest; one sent by reference keeps
none, so it is sent again) is not sent again until it changes, or unless ``retry_failed``:
a scheduled sync must not make a fresh dead letter of the same file on every run. With
``prune``, documents under the prefix whose file is gone are deleted."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.orm import Session

from shared.documents import repository as repo
from shared.documents.schemas import Upload
from shared.documents.service import content_hash
from shared.jobs import repository as jobs_repo
from shared.parsing import resolve_content_type


@dataclass(frozen=True)
class LocalFile:
    path: Path
    external_id: str
    digest: str  # content_hash: bytes, type, title, metadata
    raw_digest: str  # the bytes' SHA-256, as an intake refusal records it


@dataclass
class SyncPlan:
    new: list[LocalFile] = field(default_factory=list)
    changed: list[LocalFile] = field(default_factory=list)
    unchanged: int = 0
    # The same content as an attempt that failed: held back, or sent again with retry_failed.
    failed_before: list[LocalFile] = field(default_factory=list)
    retried: list[LocalFile] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)  # external ids whose file is gone
    held: int = 0  # the tenant's live documents under the prefix

    def counts(self) -> dict[str, int]:
        return {
            "new": len(self.new),
            "changed": len(self.changed),
            "retry": len(self.retried),
            "unchanged": self.unchanged,
            "failed before": len(self.failed_before),
            "delete": len(self.deletes),
        }

    def uploads(self) -> list[LocalFile]:
        return [*self.new, *self.changed, *self.retried]

    def to_send(self) -> int:
        return len(self.uploads()) + len(self.deletes)


# --prune deletes at most this share of the prefix's documents without --force: a sync of the
# wrong (or an unmounted, empty) directory must not empty the tenant.
PRUNE_AT_MOST = 0.5


def prune_refusal(plan: SyncPlan, source_has_files: bool) -> str | None:
    """Why a --prune of ``plan`` needs --force (None: it does not): an empty source, or more
    than half of the prefix's documents to delete."""
    if not plan.deletes:
        return None
    if not source_has_files:
        return f"the directory is empty: --prune would delete all {len(plan.deletes)} documents"
    if len(plan.deletes) > PRUNE_AT_MOST * plan.held:
        return (
            f"--prune would delete {len(plan.deletes)} of the prefix's {plan.held} documents "
            f"(more than {PRUNE_AT_MOST:.0%})"
        )
    return None


def walk(directory: Path) -> Iterator[Path]:
    """The directory's files, recursively, in path order; hidden files and directories (a
    name starting with ".") are left out."""
    for path in sorted(directory.rglob("*")):
        relative = path.relative_to(directory)
        if path.is_file() and not any(part.startswith(".") for part in relative.parts):
            yield path


def file_upload(tenant_id: str, path: Path, external_id: str) -> Upload:
    """The upload ``concord sync`` (and ``concord ingest``) makes of a file: its bytes, the
    type its bytes and name say, its stem as the title."""
    raw = path.read_bytes()
    return Upload(
        tenant_id=tenant_id,
        external_id=external_id,
        raw=raw,
        content_type=resolve_content_type(None, path.name, raw),
        title=path.stem,
        filename=path.name,
        metadata={},
    )


def local_file(tenant_id: str, path: Path, external_id: str) -> LocalFile:
    upload = file_upload(tenant_id, path, external_id)
    return LocalFile(
        path, external_id, content_hash(upload), hashlib.sha256(upload.raw).hexdigest()
    )


def local_files(tenant_id: str, directory: Path, prefix: str) -> list[LocalFile]:
    return [
        local_file(tenant_id, path, prefix + path.relative_to(directory).as_posix())
        for path in walk(directory)
    ]


def plan(
    session: Session,
    tenant_id: str,
    files: list[LocalFile],
    prefix: str,
    prune: bool,
    retry_failed: bool = False,
    only_files: bool = False,
) -> SyncPlan:
    """``only_files``: read the tenant's documents of these files only (``ingest`` of a few
    files into a large tenant), not all of the prefix's (which ``prune`` needs)."""
    among = [f.external_id for f in files] if only_files else None
    remote = repo.live_content_hashes(session, tenant_id, prefix, among)
    failed = jobs_repo.failed_attempts(session, tenant_id, prefix, among)
    result = SyncPlan(held=len(remote))
    for f in files:
        known = remote.get(f.external_id)
        if known == f.digest:
            # The live version's content: unchanged, unless its job failed. (A refusal of
            # the same bytes that came before it no longer counts: they were indexed since.)
            if failed.versions.get(f.external_id) == f.digest:
                (result.retried if retry_failed else result.failed_before).append(f)
            else:
                result.unchanged += 1
        elif f.raw_digest in failed.refusals.get(f.external_id, ()):
            (result.retried if retry_failed else result.failed_before).append(f)
        elif known is None:
            result.new.append(f)
        else:
            result.changed.append(f)
    if prune:
        here = {f.external_id for f in files}
        result.deletes = sorted(e for e in remote if e not in here)
    return result
