"""The job service functions: quote, submit, place, cancel, read.

All are synchronous and take the ServerContext; each opens its own short transactions. Submission
only stores the job as queued (refusing, 402, one that would take its tenant over its monthly spend
cap): the placer (``control_layer.placer``) calls ``place_job`` in admission order. A job that does
not fit now stays queued with the reason; it fails only when it could never run on the fleet as
registered, even with every device free. Planning happens
outside any transaction, on a snapshot read just before; the allocation that follows re-checks
everything under row locks (see ``allocation``), so a stale plan costs a re-plan, never a double
booking.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from contracts.errors import FailedPrecondition, InvalidArgument, NoFeasiblePlan, NotFound
from contracts.job_spec import JobSpec
from contracts.roles import Principal
from contracts.states import JOB_TERMINAL, JobState
from control_layer.admission import device_quota_wait, spend_refusal
from control_layer.allocation import AllocationConflict, allocate
from control_layer.calibration_store import load_calibration
from control_layer.capacity import with_devices_free
from control_layer.dispatch import dispatch
from control_layer.failed_nodes import nodes_to_avoid
from control_layer.job_refs import fleet_regions, node_staging_facts, resolve_job_refs
from control_layer.lifecycle import transition
from control_layer.live_snapshot import current_snapshot
from control_layer.option_choice import CHOICES, choose_option
from control_layer.planner import plan
from control_layer.planner.plan_types import Calibration, PlanOption
from control_layer.planner.sync_choice import pinned
from control_layer.preempting import preempt_for
from control_layer.queue import (
    PassState,
    devices_in_use,
    month_label,
    month_spend,
)
from control_layer.snapshot import measuring_nodes
from control_layer.stage_sections import JobStage, job_stage
from control_layer.submissions import submit_job as submit_job  # the submit step of the service
from control_layer.task_states import clip_message
from control_layer.user_data import needs_resolution
from control_layer.victim_choice import why_no_preemption
from control_layer.worker_config import job_sync_secret
from orchestration.context import ServerContext
from orchestration.db.base import utcnow
from orchestration.db.engine import session_scope
from orchestration.db.models import Job, Quote, Task, Tenant
from orchestration.events import record_event

log = logging.getLogger(__name__)

QUOTE_TTL_S = 15 * 60.0
PLACEMENT_TRIES = 5  # plans tried when allocations keep colliding with concurrent placements


def plan_now(
    ctx: ServerContext,
    spec: JobSpec,
    *,
    exclude_nodes: frozenset[str] = frozenset(),
    calibration: Calibration | None = None,
    tenant_id: str | None = None,
    strict: bool = True,
) -> list[PlanOption]:
    """Options on a snapshot and the calibration of this moment (read in one short transaction;
    a caller planning many jobs at once may pass the calibration it read for all of them).

    With ``tenant_id``, the spec's code, data and outputs are checked and sized first
    (``control_layer.user_data``; InvalidArgument naming the field) and each option's staging is
    priced; ``strict=False`` (placement) prices an https source that does not answer as unknown."""
    with session_scope(ctx.session_factory) as session:
        snapshot = current_snapshot(ctx, session, exclude_nodes=exclude_nodes)
        if calibration is None:
            calibration = load_calibration(session)
    staging = None
    if tenant_id is not None and needs_resolution(spec):
        refs = resolve_job_refs(ctx, tenant_id, spec, fleet_regions(snapshot), strict=strict)
        if spec.code or spec.data.source or spec.data.shards:
            with session_scope(ctx.session_factory) as session:
                facts = node_staging_facts(session, refs, spec)
            staging = refs.staging(spec, ctx.settings.artifact_store_region, facts)
    return plan(spec, snapshot, calibration, staging=staging)


# -- quotes and submission ------------------------------------------------------------------------


def create_quote(ctx: ServerContext, tenant_id: str, spec: JobSpec, *, ttl_s: float = QUOTE_TTL_S) -> Quote:
    """Ranked, priced options valid for ``ttl_s``; NoFeasiblePlan propagates (nothing is stored)."""
    return quote_with_options(ctx, tenant_id, spec, ttl_s=ttl_s)[0]


def quote_with_options(
    ctx: ServerContext, tenant_id: str, spec: JobSpec, *, ttl_s: float = QUOTE_TTL_S
) -> tuple[Quote, list[PlanOption]]:
    """create_quote, also returning the options as planned (no need to re-read them from JSON)."""
    try:
        options = plan_now(ctx, spec, tenant_id=tenant_id)
    except NoFeasiblePlan as exc:
        raise measuring_note(ctx, exc) from None
    with session_scope(ctx.session_factory) as session:
        _tenant(session, tenant_id)
        quote = Quote(
            tenant_id=tenant_id,
            spec=spec.model_dump(mode="json"),
            options=[o.model_dump(mode="json") for o in options],
            expires_at=utcnow() + timedelta(seconds=ttl_s),
        )
        session.add(quote)
    return quote, options


# -- placement ------------------------------------------------------------------------------------

NEVER_FITS = "could never run on the fleet as registered, even with every device free"


def place_job(
    ctx: ServerContext,
    job_id: str,
    *,
    calibration: Calibration | None = None,
    state: PassState | None = None,
) -> str:
    """Place a queued job: allocate its option's devices (re-planning on a fresh snapshot whenever
    the fleet moved underneath), create its tasks and dispatch them. A job that does not fit now
    (devices busy, its tenant's device quota or spend cap) stays queued with the reason in
    ``deferred``; one of higher priority may first have lower-priority preemptible jobs preempted
    (``ctx.preempt_job``, see ``control_layer.victim_choice``). It fails only when it could never fit
    the fleet as registered. If placements keep colliding it stays queued and the placer tries
    again later. A job that is not queued is left alone.

    Returns what happened: placed, waiting (devices), quota (its tenant's quota or cap), failed,
    deferred (collisions) or skipped. ``calibration``: as read once for a whole pass of the placer
    (it moves as runs finish and queued tasks start), else read here; ``state``: the pass's
    shared state."""
    state = state if state is not None else PassState()
    with session_scope(ctx.session_factory) as session:
        job = _job(session, job_id)
        if job.status != JobState.QUEUED:
            return "skipped"
        tenant = _tenant(session, job.tenant_id)
        spec = JobSpec.model_validate(job.spec)
        # The accepted option is tried first only on the first placement; a re-placement plans anew
        # and stays off the nodes where this job's tasks failed.
        option = PlanOption.model_validate(job.option) if job.option and job.attempt == 0 else None
        # (never placed: no task of it ever failed)
        avoid = nodes_to_avoid(session, job_id) if job.attempt > 0 else frozenset()
        choice = job.choice if job.choice in CHOICES else "cheapest"
        # On a re-placement the reason why is kept in front of whatever happens next.
        context = f"{job.reason}; " if job.attempt > 0 and job.reason else ""
        known = job.deferred  # a pass that finds the same reason writes nothing
        in_use = state.devices_in_use.get(tenant.id)
        if in_use is None and tenant.max_devices is not None:
            in_use = devices_in_use(session, [tenant.id]).get(tenant.id, 0)
        in_use = in_use or 0
        # A job already estimated was checked against the cap at submission; a spec is checked here.
        spend = (
            month_spend(session, tenant.id, utcnow())
            if tenant.max_monthly_spend is not None and job.estimated_cost is None
            else None
        )

    if tenant.max_devices is not None and in_use >= tenant.max_devices:
        # no job needs fewer than one device: no need to plan
        return keep_waiting(
            ctx, job_id, device_quota_wait(in_use, 1, tenant.max_devices) or "", "quota", known
        )
    key = _spec_key(spec, avoid, choice)
    last_conflict = ""
    for _ in range(PLACEMENT_TRIES):
        if option is None:
            if key in state.not_now:
                return keep_waiting(ctx, job_id, state.not_now[key], "waiting", known)
            try:
                option = choose_option(
                    plan_now(
                        ctx,
                        spec,
                        exclude_nodes=avoid,
                        calibration=calibration,
                        tenant_id=tenant.id,
                        strict=False,
                    ),
                    choice,
                )
            except NoFeasiblePlan as exc:
                return _not_now(ctx, job_id, spec, avoid, exc, calibration, state, key, context)
            except InvalidArgument as exc:  # an artifact gone since submission, a store removed
                _fail_queued(ctx, job_id, f"{context}cannot place: {exc.message}", exc.details)
                return "failed"
        quota = device_quota_wait(in_use, option.n_devices, tenant.max_devices)
        if quota is not None:
            return keep_waiting(ctx, job_id, quota, "quota")
        if spend is not None:
            refusal = spend_refusal(
                option.estimates.cost.total, spend, tenant.max_monthly_spend, month_label(utcnow())
            )
            if refusal is not None:
                return keep_waiting(
                    ctx, job_id, f"{refusal.message}; waits for next month or a higher cap", "quota"
                )
        try:
            _place_once(ctx, job_id, spec, option, tenant.id)
            state.devices_in_use[tenant.id] = in_use + option.n_devices
            if state.free_devices is not None:
                state.free_devices = max(0, state.free_devices - option.n_devices)
            return "placed"
        except AllocationConflict as exc:
            last_conflict = exc.message
        except OperationalError as exc:
            if not _is_retryable(exc):
                raise
            last_conflict = f"database contention: {exc.orig}"
        except FailedPrecondition as exc:
            _fail_queued(ctx, job_id, f"{context}cannot place: {exc.message}", exc.details)
            return "failed"
        log.info("placement of job %s collided (%s); re-planning", job_id, last_conflict)
        option = None
    _defer(
        ctx,
        job_id,
        f"devices contended: {PLACEMENT_TRIES} placements collided; last: {last_conflict}",
    )
    return "deferred"


def _spec_key(spec: JobSpec, avoid: frozenset[str], choice: str) -> str:
    return json.dumps([spec.model_dump(mode="json"), sorted(avoid), choice], sort_keys=True)


def _not_now(
    ctx: ServerContext,
    job_id: str,
    spec: JobSpec,
    avoid: frozenset[str],
    exc: NoFeasiblePlan,
    calibration: Calibration | None,
    state: PassState,
    key: str,
    context: str,
) -> str:
    """No plan on the fleet as it is: fail the job if none exists with every device free either,
    else have lower-priority work preempted where that lets it fit, and keep it queued."""
    if key not in state.never:
        if state.measuring is None:
            # Read before the fleet it qualifies: a profile landing between the two reads would
            # otherwise fail a job that fits the node it just made placeable.
            state.measuring = _measuring(ctx)
        state.never[key] = never_fits(ctx, spec, avoid, calibration)
    never = state.never[key]
    if never is not None and (measuring := state.measuring):
        # Nodes still measuring are not in the fleet yet: the job waits for them, not fails.
        reason = f"waiting for {measuring} node(s) measuring their profile: {never}"
        return keep_waiting(ctx, job_id, reason, "waiting")
    if never is not None:
        _fail_queued(ctx, job_id, f"{context}no feasible placement: {NEVER_FITS}: {never}", exc.details)
        return "failed"
    reason = f"waiting for devices: {exc.message}"
    if ctx.preempt_job is not None:
        victims = preempt_for(ctx, job_id, spec, avoid, calibration)
        if victims:
            reason = f"waiting for devices: preempting {', '.join(victims)} (lower priority)"
        elif note := why_no_preemption(spec.qos.priority, state.lowest_active, state.lowest_preemptible):
            reason = f"{reason}; {note}"
    state.not_now.setdefault(key, reason)
    return keep_waiting(ctx, job_id, reason, "waiting")


def _measuring(ctx: ServerContext) -> int:
    with session_scope(ctx.session_factory) as session:
        return measuring_nodes(session)


def measuring_note(ctx: ServerContext, exc: NoFeasiblePlan) -> NoFeasiblePlan:
    """``exc``, saying so where nodes still measuring their profile may yet offer a plan."""
    measuring = _measuring(ctx)
    if not measuring:
        return exc
    return NoFeasiblePlan(
        f"{exc.message}; {measuring} node(s) are still measuring their profile and not offered"
        " yet: quote again once they are ready, or submit the spec (it queues until then)",
        **exc.details,
        measuring_nodes=measuring,
    )


def never_fits(
    ctx: ServerContext, spec: JobSpec, avoid: frozenset[str], calibration: Calibration | None
) -> str | None:
    """Why ``spec`` has no plan even with every device of the fleet free; None if it has one."""
    with session_scope(ctx.session_factory) as session:
        snapshot = current_snapshot(ctx, session, exclude_nodes=avoid)
        if calibration is None:
            calibration = load_calibration(session)
    try:
        plan(spec, with_devices_free(snapshot), calibration)
    except NoFeasiblePlan as exc:
        return exc.message
    return None


def keep_waiting(ctx: ServerContext, job_id: str, reason: str, outcome: str, known: str | None = None) -> str:
    """Keep the job queued with ``reason`` (written only when it differs from ``known``, the
    reason last read, and from the stored one)."""
    reason = clip_message(reason)
    if reason == known:
        return outcome
    with session_scope(ctx.session_factory) as session:
        job = session.get(Job, job_id)
        if job is not None and job.status == JobState.QUEUED and job.deferred != reason:
            job.deferred = reason
    return outcome


def _place_once(ctx: ServerContext, job_id: str, spec: JobSpec, option: PlanOption, tenant_id: str) -> None:
    stage = _stage(ctx, job_id, spec, option, tenant_id)  # before the locks: it may ask the network
    with session_scope(ctx.session_factory) as session:
        job = _lock_job(session, job_id)
        if job.status != JobState.QUEUED:
            return
        previous = job.reason
        secret = job_sync_secret(ctx.settings.secret_key, job.id)
        # The sync settings the planner chose stay the job's: a re-placement plans with them, so
        # every attempt and replacement region trains with the same H and codec.
        spec = pinned(spec, option)
        fee = ctx.settings.platform_fee  # the fee in force now, like the prices
        tasks = allocate(
            session,
            job,
            spec,
            option,
            attempt=job.attempt + 1,
            sync_secret=secret,
            platform_fee=fee,
            stage=stage,
        )
        job.spec = spec.model_dump(mode="json")
        job.option = option.model_dump(mode="json")
        job.estimated_duration_s = option.estimates.duration_s
        job.estimated_cost = option.estimates.cost.total
        reason = "" if job.attempt == 0 else f"re-placed as attempt {job.attempt + 1} after: {previous}"
        transition(
            session,
            ctx.bus,
            job,
            JobState.PLACED,
            reason=reason,
            payload={
                "option_id": option.id,
                "tasks": [
                    {"id": t.id, "node_id": t.node_id, "region": t.region, "device_indices": t.device_indices}
                    for t in tasks
                ],
            },
        )
        for task in tasks:
            dispatch(session, ctx.bus, task)


def _stage(
    ctx: ServerContext, job_id: str, spec: JobSpec, option: PlanOption, tenant_id: str
) -> JobStage | None:
    """The job's stage sections for this placement (None: it stages nothing); a reference that no
    longer resolves is a FailedPrecondition, which fails the job with the reason."""
    if not (needs_resolution(spec) or spec.outputs.checkpoint):
        return None
    try:
        refs = resolve_job_refs(ctx, tenant_id, spec, strict=False)
    except InvalidArgument as exc:
        raise FailedPrecondition(exc.message, **exc.details) from None
    staging = option.estimates.staging
    s3 = ctx.s3_store
    return job_stage(
        spec,
        refs,
        job_id=job_id,
        settings=ctx.settings,
        now=time.time(),
        regions=sorted(option.regions or {t.region for t in option.tasks}),
        shard_of_region=staging.shard_of_region if staging is not None else None,
        presign=s3.presign_external if s3 is not None else None,
    )


def _fail_queued(ctx: ServerContext, job_id: str, reason: str, details: dict[str, Any] | None = None) -> None:
    with session_scope(ctx.session_factory) as session:
        job = _lock_job(session, job_id)
        if job.status != JobState.QUEUED:
            return  # placed meanwhile by a concurrent caller
        transition(
            session, ctx.bus, job, JobState.FAILED, reason=reason, payload={"details": _jsonable(details)}
        )


def _defer(ctx: ServerContext, job_id: str, reason: str) -> None:
    with session_scope(ctx.session_factory) as session:
        job = _lock_job(session, job_id)
        if job.status != JobState.QUEUED:
            return
        job.deferred = clip_message(reason)
        job.updated_at = utcnow()
        record_event(session, ctx.bus, "job.deferred", job.id, {"reason": reason})


def _is_retryable(exc: OperationalError) -> bool:
    # PostgreSQL deadlock_detected / serialization_failure: the transaction may simply be retried.
    return getattr(exc.orig, "sqlstate", None) in ("40P01", "40001")


def _jsonable(details: dict[str, Any] | None) -> Any:
    return json.loads(json.dumps(details or {}, default=str))


# -- cancellation and reads -----------------------------------------------------------------------


def cancel_job(ctx: ServerContext, job_id: str, reason: str, *, tenant_id: str | None = None) -> Job:
    """Cancel a job that has not finished: its tasks are told to stop and its devices released."""
    reason = reason or "cancelled by the user"
    with session_scope(ctx.session_factory) as session:
        job = _lock_job(session, job_id)
        if tenant_id is not None and job.tenant_id != tenant_id:
            raise NotFound(f"job {job_id} not found", field="job_id")
        if job.status in JOB_TERMINAL:
            raise FailedPrecondition(f"job {job_id} already {job.status}", job_id=job_id, status=job.status)
        transition(session, ctx.bus, job, JobState.CANCELLED, reason=reason)
    return job


def get_job(session: Session, tenant: Principal | str, job_id: str) -> Job:
    """The job, if ``tenant`` (a caller, or a tenant id) may see it (its own, or any for an admin key);
    NotFound otherwise."""
    job = session.get(Job, job_id)
    if job is None or not _may_see(tenant, job):
        raise NotFound(f"job {job_id} not found", field="job_id")
    return job


def list_jobs(
    session: Session, tenant: Principal | str, *, status: str | None = None, limit: int = 100
) -> list[Job]:
    """Newest first; only the tenant's own jobs (an admin key sees all)."""
    if status is not None and status not in set(JobState):
        raise InvalidArgument(f"status must be one of {[s.value for s in JobState]}", field="status")
    stmt = select(Job).order_by(Job.created_at.desc(), Job.id).limit(max(1, min(limit, 1000)))
    if isinstance(tenant, str) or not tenant.is_admin:
        stmt = stmt.where(Job.tenant_id == (tenant if isinstance(tenant, str) else tenant.id))
    if status is not None:
        stmt = stmt.where(Job.status == status)
    return list(session.scalars(stmt))


def job_tasks(session: Session, job_id: str, *, attempt: int | None = None) -> list[Task]:
    """The job's tasks (of one attempt, if given), in attempt then creation order."""
    stmt = select(Task).where(Task.job_id == job_id).order_by(Task.attempt, Task.created_at, Task.id)
    if attempt is not None:
        stmt = stmt.where(Task.attempt == attempt)
    return list(session.scalars(stmt))


def _may_see(tenant: Principal | str, job: Job) -> bool:
    if isinstance(tenant, str):
        return job.tenant_id == tenant
    return tenant.is_admin or job.tenant_id == tenant.id


def _tenant(session: Session, tenant_id: str) -> Tenant:
    tenant = session.get(Tenant, tenant_id)
    if tenant is None:
        raise NotFound(f"tenant {tenant_id} not found", field="tenant_id")
    return tenant


def _job(session: Session, job_id: str) -> Job:
    job = session.get(Job, job_id)
    if job is None:
        raise NotFound(f"job {job_id} not found", field="job_id")
    return job


def _lock_job(session: Session, job_id: str) -> Job:
    """The job row, locked for this transaction (PostgreSQL), read fresh even if the session has it."""
    job = session.scalars(
        select(Job).where(Job.id == job_id).with_for_update().execution_options(populate_existing=True)
    ).one_or_none()
    if job is None:
        raise NotFound(f"job {job_id} not found", field="job_id")
    return job
