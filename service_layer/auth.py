"""Tenants and their API keys: create, verify, bootstrap the admin.

Keys are 256-bit random strings, so a SHA-256 digest is all the storage needs (nothing to
brute-force that a slow hash would protect). The first characters are kept in clear as ``prefix``
so a lookup touches one index entry instead of hashing against every row.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from contracts.errors import Conflict, InvalidArgument, NotFound, Unauthenticated
from orchestration.db.base import utcnow
from orchestration.db.models import ApiKey, Tenant
from service_layer.key_cache import forget_everywhere

KEY_PREFIX = "cpn_"
PREFIX_LEN = 12  # "cpn_" + 8 random characters for generated keys
MIN_KEY_LEN = 20
ADMIN_TENANT = "admin"


def hash_key(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode()).hexdigest()


def key_prefix(plaintext: str) -> str:
    return plaintext[:PREFIX_LEN]


def new_api_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def create_tenant(session: Session, name: str, is_admin: bool = False) -> Tenant:
    """Add a tenant (the caller commits); names are unique."""
    if session.scalar(select(Tenant.id).where(Tenant.name == name)) is not None:
        raise Conflict(f"name: tenant {name!r} already exists", field="name")
    tenant = Tenant(name=name, is_admin=is_admin)
    session.add(tenant)
    try:
        session.flush()
    except IntegrityError as exc:  # a concurrent create won the race
        raise Conflict(f"name: tenant {name!r} already exists", field="name") from exc
    return tenant


def add_api_key(session: Session, tenant_id: str, plaintext: str | None = None) -> tuple[ApiKey, str]:
    """Store a key for ``tenant_id`` (a fresh random one unless given); the plaintext is returned once."""
    if session.get(Tenant, tenant_id) is None:
        raise NotFound(f"tenant {tenant_id} not found", tenant_id=tenant_id)
    plaintext = plaintext or new_api_key()
    if len(plaintext) < MIN_KEY_LEN:
        raise InvalidArgument(f"api key: must be at least {MIN_KEY_LEN} characters", field="api_key")
    row = ApiKey(tenant_id=tenant_id, prefix=key_prefix(plaintext), key_hash=hash_key(plaintext))
    session.add(row)
    session.flush()
    return row, plaintext


def authenticate(session: Session, plaintext: str | None) -> Tenant:
    """The tenant owning an unrevoked key. Missing, unknown and revoked keys read the same."""
    if not plaintext:
        raise Unauthenticated("missing API key: send 'Authorization: Bearer <key>'")
    digest = hash_key(plaintext)
    # One round trip for key and tenant: every authenticated request pays it.
    candidates = session.execute(
        select(ApiKey.key_hash, Tenant)
        .join(Tenant, Tenant.id == ApiKey.tenant_id)
        .where(ApiKey.prefix == key_prefix(plaintext), ApiKey.revoked_at.is_(None))
    ).all()
    for key_hash, tenant in candidates:
        if hmac.compare_digest(key_hash, digest):
            return tenant
    raise Unauthenticated("invalid API key")


def revoke_api_key(session: Session, key_id: str) -> ApiKey:
    key = session.get(ApiKey, key_id)
    if key is None:
        raise NotFound(f"api key {key_id} not found", key_id=key_id)
    key.revoked_at = key.revoked_at or utcnow()
    forget_everywhere()  # this process stops honouring it now; other replicas within key_cache.TTL_S
    return key


def bootstrap_admin(session: Session, plaintext: str) -> Tenant:
    """Make sure the admin tenant exists and ``plaintext`` is one of its keys (idempotent)."""
    if len(plaintext) < MIN_KEY_LEN:
        raise InvalidArgument(
            f"admin_api_key: must be at least {MIN_KEY_LEN} characters (CPN_ADMIN_API_KEY)",
            field="admin_api_key",
        )
    tenant = session.scalar(select(Tenant).where(Tenant.name == ADMIN_TENANT))
    if tenant is None:
        tenant = create_tenant(session, ADMIN_TENANT, is_admin=True)
    elif not tenant.is_admin:
        raise Conflict(f"a non-admin tenant is named {ADMIN_TENANT!r}; rename it before bootstrapping")
    existing = session.scalar(select(ApiKey).where(ApiKey.key_hash == hash_key(plaintext)))
    if existing is None:
        add_api_key(session, tenant.id, plaintext)
    elif existing.tenant_id != tenant.id or existing.revoked_at is not None:
        raise Conflict(
            "admin_api_key: this key belongs to another tenant or was revoked", field="admin_api_key"
        )
    return tenant
