"""Cost accounting of finished jobs: device-hours x the price locked in at placement, plus WAN egress.

Every task that ran is charged, whatever attempt it belonged to: a failed attempt still held its
devices. Egress is the task leader's cumulative WAN bytes sent (from its last metrics or result)
at the egress price between its region and the job's other regions.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from contracts.states import JOB_TERMINAL
from orchestration.db.base import utcnow
from orchestration.db.engine import as_utc
from orchestration.db.models import Job, LedgerEntry, Task

BYTES_PER_GB = 1e9


def task_device_hours(task: Task, now: datetime | None = None) -> float:
    """Devices x hours between the task starting to run and finishing (or ``now``, if it still runs)."""
    if task.started_at is None:
        return 0.0
    end = as_utc(task.finished_at) if task.finished_at is not None else (now or utcnow())
    seconds = max(0.0, (end - as_utc(task.started_at)).total_seconds())
    return len(task.device_indices) * seconds / 3600.0


def wan_bytes_sent(last_metrics: dict[str, Any] | None, result: dict[str, Any] | None) -> float:
    """A task leader's cumulative WAN bytes sent: the larger of its last metrics and its result."""
    sent = 0.0
    for source in (last_metrics or {}, result or {}):
        value = source.get("wan_bytes_sent")
        if isinstance(value, int | float) and value > sent:
            sent = float(value)
    return sent


def task_egress_gb(task: Task) -> float:
    return wan_bytes_sent(task.last_metrics, task.result) / BYTES_PER_GB


def wan_bytes_by_region(session: Session) -> dict[str, float]:
    """Every byte the tasks' leaders sent over the WAN, by the sending task's region: the egress
    billed to finished jobs plus what the tasks of unfinished jobs have reported so far. A job's
    bytes move from the second part to the first in the transaction that finishes it, so the
    total never falls (Prometheus reads a fall as a counter reset)."""
    out: dict[str, float] = {}
    billed = session.execute(
        select(LedgerEntry.region, func.sum(LedgerEntry.quantity))
        .where(LedgerEntry.kind == "egress")
        .group_by(LedgerEntry.region)
    ).all()
    for region, gb in billed:
        out[region] = out.get(region, 0.0) + float(gb or 0.0) * BYTES_PER_GB
    unbilled = session.execute(
        select(Task.region, Task.last_metrics, Task.result)
        .join(Job, Job.id == Task.job_id)
        .where(Job.status.not_in([s.value for s in JOB_TERMINAL]))
    ).all()
    for region, last_metrics, result in unbilled:
        out[region] = out.get(region, 0.0) + wan_bytes_sent(last_metrics, result)
    return out


def record_job_cost(session: Session, job: Job) -> float:
    """Write the job's ledger lines (once) and set ``job.actual_cost``; returns the total."""
    existing = session.scalars(select(LedgerEntry.amount).where(LedgerEntry.job_id == job.id)).all()
    if existing:
        job.actual_cost = float(sum(existing))
        return job.actual_cost
    tasks = session.scalars(select(Task).where(Task.job_id == job.id).order_by(Task.attempt, Task.id)).all()
    total = 0.0
    now = utcnow()
    for task in tasks:
        charges = (
            ("gpu", task_device_hours(task, now), task.price_per_device_hour),
            ("egress", task_egress_gb(task), task.egress_price_per_gb),
        )
        for kind, quantity, unit_price in charges:
            if quantity <= 0:
                continue
            amount = quantity * unit_price
            session.add(
                LedgerEntry(
                    job_id=job.id,
                    tenant_id=job.tenant_id,
                    task_id=task.id,
                    attempt=task.attempt,
                    region=task.region,
                    cluster_id=task.cluster_id,
                    kind=kind,
                    quantity=quantity,
                    unit_price=unit_price,
                    amount=amount,
                )
            )
            total += amount
    job.actual_cost = total
    return total


def cost_summary(session: Session, job: Job) -> dict[str, Any]:
    """Estimated (from the accepted option) next to actual (from the ledger) for one job."""
    entries = session.scalars(select(LedgerEntry).where(LedgerEntry.job_id == job.id)).all()
    actual = {"device_hours": 0.0, "gpu": 0.0, "egress_gb": 0.0, "egress": 0.0}
    for e in entries:
        if e.kind == "gpu":
            actual["device_hours"] += e.quantity
            actual["gpu"] += e.amount
        else:
            actual["egress_gb"] += e.quantity
            actual["egress"] += e.amount
    actual["total"] = actual["gpu"] + actual["egress"]
    estimates = (job.option or {}).get("estimates") or {}
    cost = estimates.get("cost") or {}
    n_devices = len((job.option or {}).get("tasks") or [])
    duration_s = float(estimates.get("duration_s") or 0.0)
    estimated = {
        "device_hours": n_devices * duration_s / 3600.0,
        "gpu": float(cost.get("devices") or 0.0),
        "egress": float(cost.get("egress") or 0.0),
        "total": float(cost.get("total") or job.estimated_cost or 0.0),
        "duration_s": duration_s,
    }
    actual_duration = None
    if job.started_at is not None and job.finished_at is not None:
        actual_duration = (as_utc(job.finished_at) - as_utc(job.started_at)).total_seconds()
    actual["duration_s"] = actual_duration
    return {
        "job_id": job.id,
        "estimated": estimated,
        "actual": actual,
        "lines": [
            {
                "task_id": e.task_id,
                "attempt": e.attempt,
                "region": e.region,
                "kind": e.kind,
                "quantity": e.quantity,
                "unit_price": e.unit_price,
                "amount": e.amount,
            }
            for e in entries
        ],
    }


def tenant_spend(session: Session, tenant_id: str) -> float:
    return float(sum(session.scalars(select(LedgerEntry.amount).where(LedgerEntry.tenant_id == tenant_id))))
