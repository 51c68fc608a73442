"""Metering: charge tasks' device time and egress as they run, and close the meter at their end.

A meter takes the job's row lock first (as every reaction to the job's tasks does), re-reads the
tasks' watermarks under it, and moves the watermarks in the same transaction that writes the
charges: a retried or repeated meter finds nothing left to charge, and two replicas metering at
once take turns. The unique (task, kind, meter_from) constraint backs this up in the database.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from orchestration.db.base import utcnow
from orchestration.db.engine import as_utc
from orchestration.db.models import Cluster, Job, LedgerTransaction, Provider, Task
from orchestration.ledger.accounts import post_charge
from orchestration.ledger.postings import MICROS, TaskMeter, meter


def wan_bytes_sent(last_metrics: dict[str, Any] | None, result: dict[str, Any] | None) -> int:
    """A task leader's cumulative WAN bytes sent: the larger of its last metrics and its result."""
    sent = 0
    for source in (last_metrics or {}, result or {}):
        value = source.get("wan_bytes_sent")
        if (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and math.isfinite(value)
            and value > sent
        ):
            sent = int(value)
    return sent


def task_meter(task: Task) -> TaskMeter:
    return TaskMeter(
        started_at=as_utc(task.started_at) if task.started_at is not None else None,
        finished_at=as_utc(task.finished_at) if task.finished_at is not None else None,
        metered_until=as_utc(task.metered_until) if task.metered_until is not None else None,
        devices=len(task.device_indices),
        price_per_device_hour=task.price_per_device_hour,
        egress_price_per_gb=task.egress_price_per_gb,
        metered_egress_bytes=task.metered_egress_bytes,
        reported_egress_bytes=wan_bytes_sent(task.last_metrics, task.result),
    )


def _providers(session: Session, tasks: Iterable[Task]) -> dict[str, str]:
    clusters = {t.cluster_id for t in tasks}
    if not clusters:
        return {}
    return dict(
        session.execute(
            select(Cluster.id, Provider.name)
            .join(Provider, Provider.id == Cluster.provider_id)
            .where(Cluster.id.in_(clusters))
        ).all()
    )


def meter_tasks(
    session: Session, job: Job, tasks: list[Task], now: datetime | None = None
) -> list[LedgerTransaction]:
    """Charge each task up to ``now`` (a task that has ended: up to its end). The caller holds the
    job's row lock, and the tasks were read under it."""
    now = now or utcnow()
    providers = _providers(session, tasks)
    written = []
    for task in tasks:
        metered = meter(task_meter(task), now)
        for charge in metered.charges:
            written.append(
                post_charge(
                    session,
                    task=task,
                    tenant_id=job.tenant_id,
                    provider=providers.get(task.cluster_id, ""),
                    charge=charge,
                )
            )
        task.metered_until = metered.metered_until
        task.metered_egress_bytes = metered.metered_egress_bytes
    return written


def meter_job(session: Session, job: Job, now: datetime | None = None) -> list[LedgerTransaction]:
    """Charge every task of the job that ran, on fresh rows (the caller holds the job's row lock)."""
    tasks = list(
        session.scalars(
            select(Task)
            .where(Task.job_id == job.id, Task.started_at.is_not(None))
            .order_by(Task.attempt, Task.id)
            .execution_options(populate_existing=True)
        )
    )
    return meter_tasks(session, job, tasks, now)


def job_charges(session: Session, job_id: str) -> float:
    """What the job's tenant has been charged for it: the sum of its debits."""
    micros = session.scalar(
        select(func.coalesce(func.sum(LedgerTransaction.amount_micros), 0)).where(
            LedgerTransaction.job_id == job_id
        )
    )
    return int(micros or 0) / MICROS


def close_job(session: Session, job: Job) -> float:
    """At the job's end: close every task's meter (each has ended by now) and set
    ``job.actual_cost`` to the sum of its charges; returns it."""
    meter_job(session, job)
    session.flush()
    job.actual_cost = job_charges(session, job.id)
    return job.actual_cost
