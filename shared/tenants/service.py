"""API keys: stored only as SHA-256 hashes, one tenant each, with scopes."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass

from sqlalchemy.orm import Session

from shared.db import Transactions
from shared.db.repository import lock_key, now
from shared.errors import BadRequest, Conflict, Forbidden, Unauthorized
from shared.models import ApiKey
from shared.tenants import repository as repo
from shared.tenants.schemas import SCOPES, KeyView

KEY_PREFIX = "ck_"
# Unrevoked keys a tenant may hold. Each is a rate-limit bucket, a row every key listing
# returns and an entry the API may keep in memory; a script minting a key per request would
# otherwise grow all three without end.
MAX_LIVE_KEYS_PER_TENANT = 100
_TENANT_ID = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
# What create_key makes: the prefix and 32 random bytes, URL-safe base64 without padding.
_KEY_FORMAT = re.compile(r"ck_[A-Za-z0-9_-]{43}")


@dataclass(frozen=True)
class Principal:
    key_id: uuid.UUID
    tenant_id: str
    scopes: frozenset[str]

    def require(self, scope: str) -> None:
        # admin implies read and write; nothing implies admin.
        granted = self.scopes | ({"read", "write"} if "admin" in self.scopes else set())
        if scope not in granted:
            raise Forbidden(f"this API key lacks the {scope!r} scope")


def validate_tenant_id(tenant_id: str) -> str:
    if not _TENANT_ID.match(tenant_id):
        raise BadRequest(
            "tenant id must be 1-64 chars of a-z, 0-9, '_' or '-', starting with a letter or digit"
        )
    return tenant_id


def check_key_format(secret: str) -> None:
    """A string that cannot be a key fails here, before any lookup (a flood of made-up keys
    costs no database work)."""
    if not _KEY_FORMAT.fullmatch(secret):
        raise Unauthorized("invalid or revoked API key")


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def create_key(
    session: Session, tenant_id: str, name: str, scopes: list[str]
) -> tuple[ApiKey, str]:
    """Returns the key row and the secret, which is shown once and never stored."""
    validate_tenant_id(tenant_id)
    unknown = set(scopes) - set(SCOPES)
    if unknown or not scopes:
        raise BadRequest(f"scopes must be a non-empty subset of {list(SCOPES)}")
    repo.ensure_tenant(session, tenant_id)
    lock_key(session, f"api-keys:{tenant_id}")  # two creates cannot both pass the count
    if repo.live_key_count(session, tenant_id) >= MAX_LIVE_KEYS_PER_TENANT:
        raise Conflict(
            f"a tenant has at most {MAX_LIVE_KEYS_PER_TENANT} unrevoked API keys: revoke one first"
        )
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey(
        id=uuid.uuid4(),
        tenant_id=tenant_id,
        name=name,
        key_prefix=secret[:10],
        key_hash=_hash(secret),
        scopes=sorted(set(scopes)),
    )
    repo.add_key(session, key)
    return key, secret


def authenticate(session: Session, secret: str | None) -> Principal:
    if not secret:
        raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'")
    check_key_format(secret)
    digest = _hash(secret)
    key = repo.key_by_hash(session, digest)
    # The lookup is by hash; the constant-time compare guards the final equality anyway.
    if key is None or key.revoked_at is not None or not hmac.compare_digest(key.key_hash, digest):
        raise Unauthorized("invalid or revoked API key")
    return Principal(key.id, key.tenant_id, frozenset(key.scopes))


# Keys verified recently, by hash: digest -> (valid until, on the monotonic clock; principal).
_recent: OrderedDict[str, tuple[float, Principal]] = OrderedDict()
_recent_lock = threading.Lock()
RECENT_KEYS_MAX = 10_000


def recently_authenticated(secret: str | None, ttl_s: float) -> Principal | None:
    """The principal of a key verified within the last ``ttl_s`` seconds, from memory (no
    database, no thread: the API answers it on its event loop), else None."""
    if not secret or ttl_s <= 0:
        return None
    with _recent_lock:
        entry = _recent.get(_hash(secret))
    return entry[1] if entry is not None and entry[0] > time.monotonic() else None


def authenticate_recent(transactions: Transactions, secret: str | None, ttl_s: float) -> Principal:
    """:func:`authenticate`, looking a key up at most once every ``ttl_s`` seconds (0: every
    time). Only keys that passed are remembered, so a new key works at once and a wrong one
    is always looked up; :func:`forget_key` drops a revoked one."""
    remembered = recently_authenticated(secret, ttl_s)
    if remembered is not None:
        return remembered
    with transactions() as uow:
        principal = authenticate(uow.session, secret)
    if ttl_s > 0 and secret:  # it passed: remember it
        with _recent_lock:
            digest = _hash(secret)
            _recent[digest] = (time.monotonic() + ttl_s, principal)
            _recent.move_to_end(digest)
            while len(_recent) > RECENT_KEYS_MAX:
                _recent.popitem(last=False)
    return principal


def forget_key(key_id: uuid.UUID) -> None:
    """This process looks the key up again at its next use (call it once its revocation has
    committed: a lookup before that would remember the key as valid)."""
    with _recent_lock:
        for digest in [d for d, (_, p) in _recent.items() if p.key_id == key_id]:
            del _recent[digest]


def list_keys(session: Session, tenant_id: str | None = None) -> list[KeyView]:
    """One tenant's keys (the API) or every key (the operator's CLI); never the secrets."""
    return [
        KeyView(
            id=k.id,
            tenant_id=k.tenant_id,
            name=k.name,
            prefix=k.key_prefix,
            scopes=k.scopes,
            created_at=k.created_at,
            revoked=k.revoked_at is not None,
        )
        for k in repo.keys_of(session, tenant_id)
    ]


def revoke_key(session: Session, key_id: uuid.UUID, tenant_id: str | None = None) -> bool:
    key = repo.key_by_id(session, key_id)
    if key is None or (tenant_id is not None and key.tenant_id != tenant_id):
        return False
    if key.revoked_at is None:
        key.revoked_at = now(session)
    return True
