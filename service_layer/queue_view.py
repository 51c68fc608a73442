"""The queue as tenants and admins read it (``GET /v1/queue``, ``cpn queue``, the dashboard)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from contracts.states import JobState
from orchestration.db.engine import as_utc
from orchestration.db.models import Job, Tenant
from service_layer.schemas.jobs import QueueEntryRead

MAX_ENTRIES = 10_000


def queue_entries(session: Session, tenant: Tenant) -> list[QueueEntryRead]:
    """Queued jobs in admission order (the placer's last positions; newer ones after): a tenant's
    own, or every tenant's for an admin."""
    stmt = select(Job).where(Job.status == JobState.QUEUED)
    if not tenant.is_admin:
        stmt = stmt.where(Job.tenant_id == tenant.id)
    jobs = list(session.scalars(stmt.limit(MAX_ENTRIES)))
    jobs.sort(
        key=lambda j: (
            j.queue_position is None,
            j.queue_position or 0,
            -j.priority,
            as_utc(j.created_at),
            j.id,
        )
    )
    return [
        QueueEntryRead(
            job_id=j.id,
            name=j.name,
            tenant_id=j.tenant_id,
            priority=j.priority,
            position=j.queue_position,
            reason=j.deferred,
            submitted_at=as_utc(j.created_at),
            attempt=j.attempt,
        )
        for j in jobs
    ]
