"""The admission queue's reads and writes: queued entries, devices in use per tenant, a tenant's
spend this month, and the positions and reasons the placer leaves on queued jobs.

The rules themselves are pure (``control_layer.admission``); these only move rows.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import bindparam, func, or_, select, update
from sqlalchemy.orm import Session

from contracts.states import JOB_ACTIVE, JOB_TERMINAL, JobState
from control_layer.admission import QueueEntry
from orchestration.db.engine import as_utc
from orchestration.db.models import Allocation, Job


@dataclass
class PassState:
    """What one placer pass learns and shares between the jobs it tries: devices in use per tenant
    (updated as it admits), and per spec what the fleet answered (the fleet only fills up within
    a pass, so a spec that did not fit now does not fit for a later job either)."""

    devices_in_use: dict[str, int] = field(default_factory=dict)
    free_devices: int | None = None  # free in the snapshot at the start, less what the pass took
    not_now: dict[str, str] = field(default_factory=dict)  # spec key -> why it waits
    never: dict[str, str | None] = field(default_factory=dict)  # spec key -> why it never fits, or None
    measuring: int | None = None  # nodes alive but still measuring their profile (once read)
    # the lowest priority of active jobs, and of those allowing preemption (when the pass read them)
    lowest_active: int | None = None
    lowest_preemptible: int | None = None


def month_start(now: datetime) -> datetime:
    return now.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def month_label(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m")


def month_spend(session: Session, tenant_id: str, now: datetime) -> float:
    """This month's spend: actual costs of jobs that ended this month plus the estimates of live
    jobs (charged when they end). One statement."""
    cost = func.coalesce(Job.actual_cost, Job.estimated_cost, 0.0)
    stmt = select(func.coalesce(func.sum(cost), 0.0)).where(
        Job.tenant_id == tenant_id,
        or_(Job.status.not_in([s.value for s in JOB_TERMINAL]), Job.finished_at >= month_start(now)),
    )
    return float(session.scalar(stmt) or 0.0)


def devices_in_use(session: Session, tenant_ids: Collection[str] | None = None) -> dict[str, int]:
    """Devices held by active allocations, per tenant."""
    stmt = (
        select(Job.tenant_id, func.count(Allocation.id))
        .join(Job, Job.id == Allocation.job_id)
        .where(Allocation.active.is_(True))
        .group_by(Job.tenant_id)
    )
    if tenant_ids is not None:
        stmt = stmt.where(Job.tenant_id.in_(list(tenant_ids)))
    return {tenant: int(n) for tenant, n in session.execute(stmt)}


@dataclass(frozen=True)
class QueuedRow:
    """What a pass needs of a queued job to pass over it without reading it again."""

    spec: dict[str, Any]
    choice: str
    attempt: int
    deferred: str | None


def queued_entries(session: Session) -> tuple[list[QueueEntry], dict[str, QueuedRow]]:
    """Every queued job: its admission entry, and its row as the pass reads it (one statement)."""
    rows = session.execute(
        select(
            Job.id,
            Job.tenant_id,
            Job.priority,
            Job.created_at,
            Job.spec,
            Job.choice,
            Job.attempt,
            Job.deferred,
        ).where(Job.status == JobState.QUEUED)
    )
    entries: list[QueueEntry] = []
    raw: dict[str, QueuedRow] = {}
    for i, t, p, c, spec, choice, attempt, deferred in rows:
        entries.append(QueueEntry(job_id=i, tenant_id=t, priority=p, submitted_at=as_utc(c)))
        raw[i] = QueuedRow(spec=spec, choice=choice, attempt=attempt, deferred=deferred)
    return entries, raw


def lowest_active_priorities(session: Session) -> tuple[int | None, int | None]:
    """The lowest priority among placed or running jobs, and among those that allow preemption
    (None where there are none). One statement."""
    rows = session.execute(
        select(Job.priority, Job.spec).where(Job.status.in_([s.value for s in JOB_ACTIVE]))
    ).all()
    preemptible = [p for p, spec in rows if (spec.get("qos") or {}).get("preemptible")]
    return (min((p for p, _ in rows), default=None), min(preemptible, default=None))


def write_queue_state(
    session: Session, positions: Mapping[str, int], reasons: Mapping[str, str | None]
) -> None:
    """Store each still-queued job's position and reason (only rows that changed are written)."""
    ids = list(positions)
    if not ids:
        return
    current = {
        i: (p, r)
        for i, p, r in session.execute(
            select(Job.id, Job.queue_position, Job.deferred).where(
                Job.id.in_(ids), Job.status == JobState.QUEUED
            )
        )
    }
    changed = [
        {"jid": i, "b_position": positions[i], "b_reason": reasons.get(i)}
        for i, (p, r) in current.items()
        if (p, r) != (positions[i], reasons.get(i))
    ]
    if changed:
        session.connection().execute(
            update(Job.__table__)
            .where(Job.__table__.c.id == bindparam("jid"), Job.__table__.c.status == JobState.QUEUED.value)
            .values(queue_position=bindparam("b_position"), deferred=bindparam("b_reason")),
            changed,
        )
