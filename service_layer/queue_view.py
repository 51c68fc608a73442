"""The queue as tenants and admins read it (``GET /v1/queue``, ``cpn queue``, the dashboard)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from contracts.states import JobState
from orchestration.db.engine import as_utc
from orchestration.db.models import Job, Tenant
from service_layer.schemas.jobs import QueueEntryRead

MAX_ENTRIES = 10_000

# Admission order as stored: the positions the placer's last pass wrote carry its whole order
# (priority, fair share by devices in use, submission time, id). What stays approximate, because
# fair share needs the live allocations and is the placer's to compute: positions counted at
# submission since that pass (priority and age only) may tie with ranked ones, and a job requeued
# since has none yet; both are placed here by priority, then age, then id.
ADMISSION_ORDER = (
    Job.queue_position.is_(None),
    Job.queue_position,
    Job.priority.desc(),
    Job.created_at,
    Job.id,
)


def queue_entries(session: Session, tenant: Tenant, limit: int = MAX_ENTRIES) -> list[QueueEntryRead]:
    """The first ``limit`` queued jobs in admission order (the placer's last positions; newer ones
    after): a tenant's own, or every tenant's for an admin. Ordered in SQL before the limit, so a
    longer queue is cut at its tail."""
    stmt = select(Job).where(Job.status == JobState.QUEUED)
    if not tenant.is_admin:
        stmt = stmt.where(Job.tenant_id == tenant.id)
    jobs = session.scalars(stmt.order_by(*ADMISSION_ORDER).limit(limit))
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
