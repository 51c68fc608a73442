"""Appending to the audit log, in the caller's transaction: an action and its record commit together."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from orchestration.db.models import AuditEvent

ACTOR_KINDS = ("tenant", "node", "system")


def record_audit(
    session: Session,
    *,
    actor_kind: str,
    actor_id: str,
    action: str,
    target: str = "",
    source: str = "",
    details: dict[str, Any] | None = None,
) -> AuditEvent:
    if actor_kind not in ACTOR_KINDS:
        raise ValueError(f"actor_kind must be one of {ACTOR_KINDS}, got {actor_kind!r}")
    row = AuditEvent(
        actor_kind=actor_kind,
        actor_id=actor_id[:64],
        action=action[:64],
        target=target[:128],
        source=source[:128],
        details=details or {},
    )
    session.add(row)
    return row
