"""Submission: a job stored as queued with its queue position and the placer woken; nothing planned.

``draft_job`` checks the request and builds the row (reading the quote when one is accepted);
``store_jobs`` stores drafts in one transaction. Under a burst, ``SubmissionBatcher`` commits in
groups: the submissions that arrive while one transaction is in flight are stored together by
the next, so N concurrent submissions cost a few transactions (each a connection checkout, a few
round trips and a commit) instead of N, and no request waits for a connection from the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from contracts.errors import CpnError, FailedPrecondition, InvalidArgument, NotFound
from contracts.job_spec import JobSpec
from contracts.states import JobState
from control_layer.admission import spend_refusal
from control_layer.job_refs import resolve_job_refs
from control_layer.lifecycle import wake_placer
from control_layer.option_choice import CHOICES, choose_option
from control_layer.planner.plan_types import PlanOption
from control_layer.planner.sync_choice import pinned
from control_layer.queue import month_label, month_spend
from control_layer.user_data import needs_resolution
from orchestration.context import ServerContext
from orchestration.db.base import new_id, utcnow
from orchestration.db.engine import as_utc, session_scope
from orchestration.db.models import Job, Quote, Tenant
from orchestration.events import record_events

log = logging.getLogger(__name__)

SUBMITTED_REASON = "waiting for the placer's next pass"
BATCH_MAX = 256  # submissions stored by one transaction at most


@dataclass(slots=True)
class JobDraft:
    """A submitted job's row, column for column (a test holds them equal): a plain object, as
    building an ORM instance costs a good part of a submission on the request path."""

    id: str
    tenant_id: str
    name: str
    spec: dict[str, Any]
    priority: int
    option: dict[str, Any] | None
    choice: str
    quote_id: str | None
    estimated_duration_s: float | None
    estimated_cost: float | None
    created_at: datetime
    updated_at: datetime
    status: str = JobState.QUEUED.value
    attempt: int = 0
    reason: str = ""
    deferred: str | None = SUBMITTED_REASON
    queue_position: int | None = None
    preemption: dict[str, Any] | None = None
    preemptions: int = 0
    actual_cost: float | None = None
    result: dict[str, Any] | None = None
    accuracy: dict[str, Any] | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None

    def values(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in _DRAFT_FIELDS}


_DRAFT_FIELDS = [f.name for f in fields(JobDraft)]


def draft_job(
    ctx: ServerContext,
    tenant_id: str,
    *,
    spec: JobSpec | None = None,
    quote_id: str | None = None,
    option_id: str | None = None,
    choice: str = "cheapest",
) -> JobDraft:
    """The queued row for a quoted option (``quote_id`` [+ ``option_id``], read here) or for a
    ``spec`` whose ``choice`` the placer will plan; not stored. Bad arguments raise."""
    if choice not in CHOICES:
        raise InvalidArgument(f"choice must be one of {list(CHOICES)}, got {choice!r}", field="choice")
    if (spec is None) == (quote_id is None):
        raise InvalidArgument("give exactly one of spec or quote_id", field="quote_id")
    if option_id is not None and quote_id is None:
        raise InvalidArgument("option_id needs the quote_id it belongs to", field="option_id")

    option: PlanOption | None = None
    if quote_id is not None:
        spec, option = _accept_quote(ctx, tenant_id, quote_id, option_id, choice)
        spec = pinned(spec, option)  # the job keeps the sync settings its option chose
    assert spec is not None  # a JobSpec is validated on construction; the placer plans it
    if quote_id is None and needs_resolution(spec):
        resolve_job_refs(ctx, tenant_id, spec)  # a bad reference: 422 naming it, nothing stored

    # Every column is set: the row is one INSERT and the answer is built from this object.
    now = utcnow()
    return JobDraft(
        id=new_id(),
        tenant_id=tenant_id,
        name=spec.name,
        spec=spec.model_dump(mode="json"),
        priority=spec.qos.priority,
        option=option.model_dump(mode="json") if option else None,
        choice=(option.label if option else None) or choice,
        quote_id=quote_id,
        estimated_duration_s=option.estimates.duration_s if option else None,
        estimated_cost=option.estimates.cost.total if option else None,
        created_at=now,
        updated_at=now,
    )


def _accept_quote(
    ctx: ServerContext, tenant_id: str, quote_id: str, option_id: str | None, choice: str
) -> tuple[JobSpec, PlanOption]:
    with session_scope(ctx.session_factory) as session:
        quote = session.get(Quote, quote_id)
        if quote is None or quote.tenant_id != tenant_id:
            raise NotFound(f"quote {quote_id} not found", field="quote_id")
        if as_utc(quote.expires_at) <= utcnow():
            raise FailedPrecondition(
                f"quote {quote_id} expired at {as_utc(quote.expires_at).isoformat()}; ask for a new quote",
                field="quote_id",
            )
        spec = JobSpec.model_validate(quote.spec)
        options = [PlanOption.model_validate(o) for o in quote.options]
    if option_id is None:
        return spec, choose_option(options, choice)
    for option in options:
        if option.id == option_id:
            return spec, option
    raise NotFound(
        f"quote {quote_id} has no option {option_id!r} (it has {[o.id for o in options]})", field="option_id"
    )


def _queued_by_priority(session: Session) -> dict[int, int]:
    jobs = Job.__table__
    stmt = select(jobs.c.priority, func.count()).where(jobs.c.status == JobState.QUEUED.value)
    return {int(p): int(n) for p, n in session.execute(stmt.group_by(jobs.c.priority))}


def store_jobs(ctx: ServerContext, drafts: Sequence[JobDraft]) -> list[JobDraft | CpnError]:
    """Store ``drafts`` as queued, in order, in one transaction; for each, the stored job (its
    ``queue_position`` set) or why it was refused: NotFound for a tenant that does not exist,
    PaymentRequired for a job that would take its tenant's spend this month over the cap (the
    drafts before it in the batch count towards that spend, as they would one after another).

    A job's position is where it lands behind every queued job of higher or equal priority (fair
    share is applied by the placer's next pass)."""
    outcomes: list[JobDraft | CpnError] = []
    now = utcnow()
    try:
        with session_scope(ctx.session_factory) as session:
            tenants = {d.tenant_id for d in drafts}
            read = select(Tenant.id, Tenant.max_monthly_spend).where(Tenant.id.in_(tenants))
            caps: dict[str, float | None] = {t: cap for t, cap in session.execute(read)}
            spent = {t: month_spend(session, t, now) for t, cap in caps.items() if cap is not None}
            ahead = _queued_by_priority(session)
            accepted: list[JobDraft] = []
            for draft in drafts:
                outcome = _admit(draft, caps, spent, ahead, now)
                outcomes.append(outcome)
                if isinstance(outcome, JobDraft):
                    accepted.append(outcome)
            if accepted:
                session.execute(insert(Job.__table__), [d.values() for d in accepted])
                submitted = [("job.submitted", d.id, _submitted(d)) for d in accepted]
                record_events(session, ctx.bus, submitted, job_channels=False)
                wake_placer(session, ctx.bus, "job submitted", accepted[0].id if len(accepted) == 1 else None)
    except IntegrityError:
        # A tenant deleted between the read and the INSERT: alone, the job is refused; in a batch,
        # each is stored alone so only that tenant's jobs are.
        if len(drafts) == 1:
            return [NotFound(f"tenant {drafts[0].tenant_id} not found", field="tenant_id")]
        return [store_jobs(ctx, [d])[0] for d in drafts]
    return outcomes


def _admit(
    draft: JobDraft, caps: dict[str, float | None], spent: dict[str, float], ahead: dict[int, int], now: Any
) -> JobDraft | CpnError:
    if draft.tenant_id not in caps:
        return NotFound(f"tenant {draft.tenant_id} not found", field="tenant_id")
    cap = caps[draft.tenant_id]
    if cap is not None:
        estimate = draft.estimated_cost or 0.0  # a spec's is 0: the placer checks it once planned
        refusal = spend_refusal(estimate, spent[draft.tenant_id], cap, month_label(now))
        if refusal is not None:
            return refusal
        spent[draft.tenant_id] += estimate
    draft.queue_position = 1 + sum(n for p, n in ahead.items() if p >= draft.priority)
    ahead[draft.priority] = ahead.get(draft.priority, 0) + 1
    return draft


def _submitted(job: JobDraft) -> dict[str, Any]:
    return {
        "tenant_id": job.tenant_id,
        "option_id": (job.option or {}).get("id"),
        "choice": job.choice,
        "quote_id": job.quote_id,
    }


def submit_job(ctx: ServerContext, tenant_id: str, **request: Any) -> JobDraft:
    """Draft and store one job now (the synchronous path: the CLI's embedded server, tests)."""
    outcome = store_jobs(ctx, [draft_job(ctx, tenant_id, **request)])[0]
    if isinstance(outcome, CpnError):
        raise outcome
    return outcome


class SubmissionBatcher:
    """Group commit of submissions on the server's event loop.

    The first submission is stored at once; those arriving while its transaction is in flight
    wait for it and are then stored together (up to ``batch_max``), and so on. With no burst a
    submission waits for nothing but its own transaction."""

    def __init__(self, ctx: ServerContext, *, batch_max: int = BATCH_MAX) -> None:
        self._ctx = ctx
        self._batch_max = batch_max
        self._waiting: list[tuple[JobDraft, asyncio.Future[JobDraft]]] = []
        self._runner: asyncio.Task[None] | None = None
        self.batches = 0  # transactions run, for tests and metrics

    async def submit(self, draft: JobDraft) -> JobDraft:
        """Store ``draft``; the stored job, or the refusal raised."""
        future: asyncio.Future[JobDraft] = asyncio.get_running_loop().create_future()
        self._waiting.append((draft, future))
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._run(), name="submissions")
        return await future

    async def _run(self) -> None:
        while self._waiting:
            batch = self._waiting[: self._batch_max]
            del self._waiting[: self._batch_max]
            self.batches += 1
            try:
                outcomes: list[JobDraft | CpnError] | BaseException = await asyncio.to_thread(
                    store_jobs, self._ctx, [draft for draft, _ in batch]
                )
            except Exception as exc:  # the database failed the whole batch: each request hears why
                log.warning("storing %d submissions failed: %s", len(batch), exc)
                outcomes = exc
            for i, (_, future) in enumerate(batch):
                if future.done():  # its request went away; the job is stored all the same
                    continue
                outcome = outcomes if isinstance(outcomes, BaseException) else outcomes[i]
                if isinstance(outcome, BaseException):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)

    async def close(self) -> None:
        """Let the batch in flight finish (requests already answered are not touched)."""
        if self._runner is not None:
            with contextlib.suppress(Exception):
                await self._runner
