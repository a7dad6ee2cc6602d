"""``concord sync``: what a directory needs sent so that a tenant's documents match it.

A file's external id is its path relative to the directory (after an optional prefix); it is
compared with the tenant's live documents by the content hash Concord itself keeps (bytes,
type, title, metadata: :func:`shared.documents.service.content_hash`), so only new and changed
files are sent, a second run sends nothing, and an interrupted run resumes by running again.
With ``prune``, documents under the prefix whose file is gone are deleted."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.orm import Session

from shared.documents import repository as repo
from shared.documents.schemas import Upload
from shared.documents.service import content_hash
from shared.ingest.parsing import resolve_content_type


@dataclass(frozen=True)
class LocalFile:
    path: Path
    external_id: str
    digest: str


@dataclass
class SyncPlan:
    new: list[LocalFile] = field(default_factory=list)
    changed: list[LocalFile] = field(default_factory=list)
    unchanged: int = 0
    deletes: list[str] = field(default_factory=list)  # external ids whose file is gone

    def counts(self) -> dict[str, int]:
        return {
            "new": len(self.new),
            "changed": len(self.changed),
            "unchanged": self.unchanged,
            "delete": len(self.deletes),
        }

    def to_send(self) -> int:
        return len(self.new) + len(self.changed) + len(self.deletes)


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
    held = len(plan.deletes) + len(plan.changed) + plan.unchanged
    if len(plan.deletes) > PRUNE_AT_MOST * held:
        return (
            f"--prune would delete {len(plan.deletes)} of the prefix's {held} documents "
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


def local_files(tenant_id: str, directory: Path, prefix: str) -> list[LocalFile]:
    files = []
    for path in walk(directory):
        external_id = prefix + path.relative_to(directory).as_posix()
        files.append(
            LocalFile(path, external_id, content_hash(file_upload(tenant_id, path, external_id)))
        )
    return files


def plan(
    session: Session, tenant_id: str, files: list[LocalFile], prefix: str, prune: bool
) -> SyncPlan:
    remote = repo.live_content_hashes(session, tenant_id, prefix)
    result = SyncPlan()
    for f in files:
        known = remote.get(f.external_id)
        if known is None:
            result.new.append(f)
        elif known != f.digest:
            result.changed.append(f)
        else:
            result.unchanged += 1
    if prune:
        here = {f.external_id for f in files}
        result.deletes = sorted(e for e in remote if e not in here)
    return result
