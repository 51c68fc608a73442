"""Tenants and their API keys: create, verify, list, revoke, bootstrap the admin.

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
from contracts.roles import PLATFORM_ROLES, Principal, Role, check_grant, default_role
from orchestration.db.base import utcnow
from orchestration.db.models import ApiKey, Tenant
from service_layer.key_cache import forget_everywhere

KEY_PREFIX = "cpn_"
PREFIX_LEN = 12  # "cpn_" + 8 random characters for generated keys
MIN_KEY_LEN = 20
MAX_MEMBER_NAME = 64
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


def add_api_key(
    session: Session,
    tenant_id: str,
    plaintext: str | None = None,
    *,
    role: Role | None = None,
    name: str = "",
    granter: Principal | None = None,
) -> tuple[ApiKey, str]:
    """Store a key for ``tenant_id`` (a fresh random one unless given); the plaintext is returned once.

    ``role`` defaults to admin for the platform tenant and tenant-admin otherwise (what every key
    could do before keys had roles). With a ``granter``, its right to hand out that role is checked.
    """
    tenant = session.get(Tenant, tenant_id)
    if tenant is None:
        raise NotFound(f"tenant {tenant_id} not found", field="tenant_id")
    role = Role(role) if role is not None else default_role(tenant.is_admin)
    if granter is not None:
        check_grant(granter, role, tenant_id, tenant.is_admin)
    elif role in PLATFORM_ROLES and not tenant.is_admin:
        raise InvalidArgument(f"role: {role} keys belong to the platform tenant only", field="role")
    if len(name) > MAX_MEMBER_NAME:
        raise InvalidArgument(f"name: must be at most {MAX_MEMBER_NAME} characters", field="name")
    plaintext = plaintext or new_api_key()
    if len(plaintext) < MIN_KEY_LEN:
        raise InvalidArgument(f"api key: must be at least {MIN_KEY_LEN} characters", field="api_key")
    row = ApiKey(
        tenant_id=tenant_id,
        prefix=key_prefix(plaintext),
        key_hash=hash_key(plaintext),
        role=str(role),
        name=name,
    )
    session.add(row)
    session.flush()
    return row, plaintext


def authenticate(session: Session, plaintext: str | None) -> Principal:
    """Who an unrevoked key acts as: its tenant and its role. Missing, unknown and revoked keys
    read the same."""
    if not plaintext:
        raise Unauthenticated("missing API key: send 'Authorization: Bearer <key>'")
    digest = hash_key(plaintext)
    # One round trip for key and tenant: every authenticated request pays it.
    candidates = session.execute(
        select(ApiKey.key_hash, ApiKey.id, ApiKey.role, ApiKey.name, Tenant.id, Tenant.name, Tenant.is_admin)
        .join(Tenant, Tenant.id == ApiKey.tenant_id)
        .where(ApiKey.prefix == key_prefix(plaintext), ApiKey.revoked_at.is_(None))
    ).all()
    for key_hash, key_id, role, member, tenant_id, tenant_name, platform in candidates:
        if hmac.compare_digest(key_hash, digest):
            return Principal(
                id=tenant_id,
                name=tenant_name,
                key_id=key_id,
                role=Role(role),
                member=member,
                platform=platform,
            )
    raise Unauthenticated("invalid API key")


def list_api_keys(session: Session, tenant_id: str | None, *, limit: int = 1000) -> list[ApiKey]:
    """Keys of one tenant (every tenant's for None), revoked ones included, oldest first."""
    stmt = select(ApiKey).order_by(ApiKey.created_at, ApiKey.id).limit(limit)
    if tenant_id is not None:
        stmt = stmt.where(ApiKey.tenant_id == tenant_id)
    return list(session.scalars(stmt))


def revoke_api_key(session: Session, key_id: str, tenant_id: str | None = None) -> ApiKey:
    """Revoke a key (of ``tenant_id`` only, when given: another tenant's key reads as not found).
    Idempotent; the caller commits. This process stops honouring it at once, other replicas once
    their cache entry ages out (``key_cache.TTL_S``)."""
    key = session.get(ApiKey, key_id)
    if key is None or (tenant_id is not None and key.tenant_id != tenant_id):
        raise NotFound(f"api key {key_id} not found", field="key_id")
    key.revoked_at = key.revoked_at or utcnow()
    forget_everywhere()
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
        add_api_key(session, tenant.id, plaintext, role=Role.ADMIN)
    elif existing.tenant_id != tenant.id or existing.revoked_at is not None or existing.role != Role.ADMIN:
        raise Conflict(
            "admin_api_key: this key belongs to another tenant, was revoked or is not an admin key",
            field="admin_api_key",
        )
    return tenant
