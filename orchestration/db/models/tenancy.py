"""Tenants and their API keys (stored hashed; only a short prefix is kept in clear for lookup), each
key with a role and, for a member, the holder's name."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column

from orchestration.db.base import Base, new_id, utcnow


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    # The platform's own tenant: only its keys may hold the fleet-wide roles (admin, operator), and
    # its keys default to admin. What a request may do is its key's role (contracts.roles).
    is_admin: Mapped[bool] = mapped_column(default=False)
    # Quotas (None: unlimited). Jobs over max_devices wait in the queue; a submission whose
    # estimate would take this month's spend over max_monthly_spend is refused (402).
    max_devices: Mapped[int | None] = mapped_column(default=None)
    max_monthly_spend: Mapped[float | None] = mapped_column(default=None)
    # Bytes of artifacts it may keep (None: the server's default, Settings.artifact_quota_bytes).
    max_artifact_bytes: Mapped[int | None] = mapped_column(BigInteger, default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    prefix: Mapped[str] = mapped_column(String(16), index=True)
    key_hash: Mapped[str] = mapped_column(String(128), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)
    role: Mapped[str] = mapped_column(String(16), default="member")  # contracts.roles.Role
    name: Mapped[str] = mapped_column(String(64), default="")  # the member holding it; "" unnamed
