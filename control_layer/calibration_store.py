"""Where calibration lives: load the current table for the planner, learn from a job as it ends.

``on_job_end`` runs inside ``lifecycle.transition`` for every end state, after the ledger charge,
in the same transaction, in a savepoint: a job's estimate-vs-actual record, the factors it moved
and their history commit together with its end; if learning fails, the end commits without them
(and an event on the job says why). ``on_task_start`` runs as a scheduler-backed task reports
RUNNING, likewise: its node's queue wait is learned from the start, not from the job's end.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from contracts.states import JobState
from control_layer import calibration as cal
from control_layer.planner.plan_types import Calibration, PlanOption
from orchestration.db.base import utcnow
from orchestration.db.engine import as_utc
from orchestration.db.models import Accelerator, CalibrationChange, CalibrationFactor, Job, Task, TaskMetric


def load_state(session: Session) -> cal.State:
    factors = {
        (f.kind, f.key): cal.Factor(f.value, f.runs) for f in session.scalars(select(CalibrationFactor))
    }
    errors: list[tuple[str, float]] = []
    for kind in (cal.TIME, cal.COST):
        rows = session.scalars(
            select(CalibrationChange.residual)
            .where(CalibrationChange.kind == kind, CalibrationChange.residual.is_not(None))
            .order_by(CalibrationChange.id.desc())
            .limit(cal.RECENT_ERRORS)
        ).all()
        errors += [(kind, float(r)) for r in reversed(rows)]
    return cal.State(factors=factors, errors=tuple(errors))


def load_calibration(session: Session) -> Calibration:
    """The planner's input as of now."""
    return cal.to_calibration(load_state(session))


def history(session: Session, limit: int = 500) -> list[CalibrationChange]:
    """Newest first."""
    stmt = select(CalibrationChange).order_by(CalibrationChange.id.desc()).limit(max(1, min(limit, 5000)))
    return list(session.scalars(stmt))


def finished_run(session: Session, job: Job) -> cal.FinishedRun | None:
    """The job's last attempt as the calibration reads it; None if it never had an option or never ran."""
    if not job.option:
        return None
    try:
        option = PlanOption.model_validate(job.option)
    except ValidationError:
        return None  # an option stored by an older planner: nothing to compare against
    tasks = list(
        session.scalars(
            select(Task).where(Task.job_id == job.id, Task.attempt == job.attempt).order_by(Task.id)
        )
    )
    started = [as_utc(t.started_at) for t in tasks if t.started_at is not None]
    finished = [as_utc(t.finished_at) for t in tasks if t.finished_at is not None]
    if not started:
        return None
    models = _device_models(session, tasks)
    runs = []
    for t in tasks:
        rows = session.scalars(
            select(TaskMetric.timings).where(TaskMetric.task_id == t.id).order_by(TaskMetric.step)
        ).all()
        runs.append(
            cal.TaskRun(
                node_id=t.node_id,
                region=t.region,
                device_model=models.get(t.id, "unknown"),
                steps=[r for r in rows if r],
                result=t.result or {},
            )
        )
    # The span the ledger bills: first task running to last task finished.
    span = (max(finished) - min(started)).total_seconds() if finished else None
    return cal.FinishedRun(
        job_id=job.id,
        at=as_utc(job.finished_at) if job.finished_at else utcnow(),
        succeeded=job.status == JobState.SUCCEEDED,
        option=option,
        tasks=runs,
        actual_duration_s=span,
        actual_cost=job.actual_cost,
    )


def _device_models(session: Session, tasks: list[Task]) -> dict[str, str]:
    nodes = {t.node_id for t in tasks}
    by_slot = {
        (a.node_id, a.index): a.model
        for a in session.scalars(select(Accelerator).where(Accelerator.node_id.in_(nodes)))
    }
    out = {}
    for t in tasks:
        found = [by_slot[(t.node_id, i)] for i in t.device_indices if (t.node_id, i) in by_slot]
        if found:
            out[t.id] = found[0]
    return out


# Advisory lock key of calibration updates (any constant unique among this database's advisory locks).
_LOCK_KEY = 0x43504E43414C  # "CPNCAL"


def _serialise(session: Session) -> None:
    """One calibration update at a time: two jobs ending together would otherwise both insert a new
    factor (a key conflict that would fail the second job's end) or lose one update. SQLite already
    serialises writers."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _LOCK_KEY})


def on_job_end(session: Session, job: Job) -> dict[str, Any] | None:
    """Record the job's estimate-vs-actual and, if it succeeded, learn from it; returns the record."""
    run = finished_run(session, job)
    if run is None:
        return None
    job.accuracy = cal.accuracy_record(run)
    if not run.succeeded:
        return job.accuracy
    _serialise(session)
    state = load_state(session)
    new_state, changes = cal.update(state, run)
    _store(session, state, new_state, changes)
    return job.accuracy


def on_task_start(session: Session, task: Task) -> bool:
    """Learn the queue wait of the task's node from its start (``cal.learn_queue_wait``); whether
    it taught anything (a task that did not queue, or whose agent said nothing, does not)."""
    result = task.result or {}
    if cal.observe_queue_wait(result) is None:
        return False
    _serialise(session)
    state = load_state(session)
    new_state, changes = cal.learn_queue_wait(state, task.node_id, task.job_id, utcnow(), result)
    _store(session, state, new_state, changes)
    return True


def _store(session: Session, state: cal.State, new_state: cal.State, changes: list[cal.Change]) -> None:
    """Write the factors that moved and their history rows."""
    for (kind, key), factor in new_state.factors.items():
        if state.factors.get((kind, key)) == factor:
            continue
        row = session.get(CalibrationFactor, (kind, key))
        if row is None:
            session.add(CalibrationFactor(kind=kind, key=key, value=factor.value, runs=factor.runs))
        else:
            row.value, row.runs, row.updated_at = factor.value, factor.runs, utcnow()
    for c in changes:
        session.add(
            CalibrationChange(
                at=c.at,
                job_id=c.job_id,
                kind=c.kind,
                key=c.key,
                old=c.old,
                new=c.new,
                observed=c.observed,
                residual=c.residual,
            )
        )
