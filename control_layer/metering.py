"""The meter loop: charges running tasks' device time and egress every ``ledger_meter_interval_s``.

Only the elected leader meters (``orchestration.leadership``), beside the reaper and the placer,
and its writes are fenced. Each job is metered in its own transaction under its row lock, so a
meter never races a report of the job's tasks, and a retried pass charges nothing twice (the
tasks' watermarks move with the charges; ``orchestration.ledger.metering``). A task's end closes
its meter where the end is handled; this loop also closes any that ended elsewhere (a dropped
elastic task), as long as its job lives.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import datetime

from sqlalchemy import or_, select

from contracts.states import JOB_TERMINAL
from orchestration.context import ServerContext
from orchestration.db.base import utcnow
from orchestration.db.engine import session_scope
from orchestration.db.models import Job, Task
from orchestration.leadership import Deposed
from orchestration.ledger import meter_job

log = logging.getLogger(__name__)


def meter_once(ctx: ServerContext, now: datetime | None = None) -> int:
    """One pass over the live jobs with tasks that run or have time left to charge; returns the
    charges written."""
    with ctx.session_factory() as session:
        job_ids = list(
            session.scalars(
                select(Task.job_id)
                .join(Job, Job.id == Task.job_id)
                .where(
                    Job.status.not_in([s.value for s in JOB_TERMINAL]),
                    Task.started_at.is_not(None),
                    # running, or ended with time not yet charged (a queued job's old attempt is done)
                    or_(
                        Task.finished_at.is_(None),
                        Task.metered_until.is_(None),
                        Task.metered_until < Task.finished_at,
                    ),
                )
                .distinct()
            )
        )
    written = 0
    for job_id in job_ids:
        try:
            with session_scope(ctx.session_factory) as session:
                job = session.scalars(
                    select(Job)
                    .where(Job.id == job_id)
                    .with_for_update()
                    .execution_options(populate_existing=True)
                ).one()
                if job.status in JOB_TERMINAL:
                    continue  # ended since the list was read: its end closed the meters
                written += len(meter_job(session, job, now or utcnow()))
        except Deposed:
            raise
        except Exception:  # one job's failure must not hold up the others' meters
            log.exception("metering job %s failed; the next pass charges what is left", job_id)
    return written


async def run_meter(ctx: ServerContext, stop: asyncio.Event) -> None:
    """Meter every ``ledger_meter_interval_s`` until ``stop`` is set; a failed pass is logged, not fatal."""
    interval = ctx.settings.ledger_meter_interval_s
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)
        if stop.is_set():
            return
        try:
            await asyncio.to_thread(meter_once, ctx)
        except Deposed:
            return
        except Exception:
            log.exception("meter pass failed")
