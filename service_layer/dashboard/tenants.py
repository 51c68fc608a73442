"""The tenants page's data: every tenant and its API keys, as prefixes only (never a hash)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from orchestration.db.engine import as_utc
from orchestration.db.models import ApiKey, Job, Tenant


@dataclass(frozen=True)
class KeyRow:
    id: str
    prefix: str
    created_at: datetime
    revoked_at: datetime | None
    role: str | None  # None where keys carry no role (the tenant's is_admin decides)


@dataclass(frozen=True)
class TenantRow:
    id: str
    name: str
    is_admin: bool
    created_at: datetime
    jobs: int
    keys: tuple[KeyRow, ...]

    @property
    def active_keys(self) -> int:
        return sum(k.revoked_at is None for k in self.keys)


def tenant_rows(session: Session) -> list[TenantRow]:
    keys: dict[str, list[KeyRow]] = defaultdict(list)
    for k in session.scalars(select(ApiKey).order_by(ApiKey.created_at, ApiKey.id)):
        keys[k.tenant_id].append(
            KeyRow(
                id=k.id,
                prefix=k.prefix,
                created_at=as_utc(k.created_at),
                revoked_at=as_utc(k.revoked_at) if k.revoked_at else None,
                role=getattr(k, "role", None),
            )
        )
    jobs = dict(session.execute(select(Job.tenant_id, func.count(Job.id)).group_by(Job.tenant_id)).all())
    return [
        TenantRow(
            t.id, t.name, t.is_admin, as_utc(t.created_at), jobs.get(t.id, 0), tuple(keys.get(t.id, []))
        )
        for t in session.scalars(select(Tenant).order_by(Tenant.name))
    ]
