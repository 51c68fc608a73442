"""Audit records for what tenants do through the API, and the admin's read of the log."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from sqlalchemy import select
from sqlalchemy.orm import Session

from contracts.roles import Principal
from orchestration.audit import record_audit
from orchestration.db.models import AuditEvent


def audit_request(
    session: Session,
    request: Request,
    tenant: Principal,
    action: str,
    target: str = "",
    details: dict[str, Any] | None = None,
) -> None:
    """Record ``action`` by the calling key's tenant (with the key, its role and holder), from the
    client's address, in the caller's transaction."""
    record_audit(
        session,
        actor_kind="tenant",
        actor_id=tenant.id,
        action=action,
        target=target,
        source=request.client.host if request.client else "",
        details={
            "tenant": tenant.name,
            "key_id": tenant.key_id,
            "role": str(tenant.role),
            **({"member": tenant.member} if tenant.member else {}),
            **(details or {}),
        },
    )


def list_audit(
    session: Session,
    *,
    after: int = 0,
    action: str | None = None,
    actor_id: str | None = None,
    limit: int = 100,
) -> list[AuditEvent]:
    """Oldest first after id ``after`` (a cursor: pass the last id seen to page on)."""
    stmt = select(AuditEvent).where(AuditEvent.id > after).order_by(AuditEvent.id).limit(limit)
    if action is not None:
        stmt = stmt.where(AuditEvent.action == action)
    if actor_id is not None:
        stmt = stmt.where(AuditEvent.actor_id == actor_id)
    return list(session.scalars(stmt))
