"""The queue page's data: jobs waiting for devices, in the order they will be admitted.

``waiting_jobs`` is the one place that decides which jobs wait and in what order; the page numbers
its rows as they come.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from contracts.states import JobState
from orchestration.db.engine import as_utc
from orchestration.db.models import Job, Tenant

QUEUE_SHOWN = 500
WAITING = (JobState.QUEUED.value,)  # the states a job waits for devices in


@dataclass(frozen=True)
class QueueRow:
    position: int
    job_id: str
    name: str
    tenant: str
    priority: int
    status: str
    reason: str
    submitted_at: datetime
    devices: int | None  # what its accepted option asks for, when it has one


def waiting_jobs(session: Session, limit: int = QUEUE_SHOWN) -> list[tuple[Job, str]]:
    """Waiting jobs with their tenant's name, first to be admitted first: in the positions the
    placer's last pass gave them (``control_layer.admission``: priority, fair share, submission
    time), jobs it has not ranked yet after them by priority and age."""
    rows = session.execute(
        select(Job, Tenant.name)
        .join(Tenant, Tenant.id == Job.tenant_id)
        .where(Job.status.in_(WAITING))
        .order_by(
            Job.queue_position.is_(None), Job.queue_position, Job.priority.desc(), Job.created_at, Job.id
        )
        .limit(limit)
    ).all()
    return [(job, tenant) for job, tenant in rows]


def queue_rows(session: Session) -> list[QueueRow]:
    return [
        QueueRow(
            position=i,
            job_id=job.id,
            name=job.name,
            tenant=tenant,
            priority=job.priority,
            status=job.status,
            reason=job.deferred or job.reason or "waiting for the placer",
            submitted_at=as_utc(job.created_at),
            devices=len((job.option or {}).get("tasks") or []) or None,
        )
        for i, (job, tenant) in enumerate(waiting_jobs(session), start=1)
    ]
