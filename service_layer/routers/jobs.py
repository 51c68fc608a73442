"""Quotes and jobs: the user's side of the API."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Body, Header, Query, Request
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from contracts.job_spec import JobSpec
from control_layer import jobs as job_service
from control_layer import submissions
from control_layer.planner.plan_types import PlanOption
from control_layer.preemption import start_preemption
from control_layer.user_data import needs_resolution
from orchestration.db.engine import as_utc, session_scope
from orchestration.db.models import Quote
from service_layer import queries
from service_layer.audit import audit_request
from service_layer.deps import AdminTenant, CtxDep, CurrentTenant, SessionDep
from service_layer.fanout import Fanout
from service_layer.queue_view import queue_entries
from service_layer.schemas.common import ROW_ID_MAX, error_responses
from service_layer.schemas.jobs import (
    JOB_EXAMPLES,
    QUOTE_EXAMPLES,
    CancelRequest,
    JobCreate,
    JobDetail,
    JobSummary,
    MetricSeries,
    PreemptRequest,
    QueueEntryRead,
    QuoteRead,
)
from service_layer.sse import job_event_stream

router = APIRouter(tags=["jobs"])


def _quote_read(q: Quote, options: list[PlanOption] | None = None) -> QuoteRead:
    """``options`` as just planned, or else read back from the stored quote."""
    return QuoteRead(
        id=q.id,
        created_at=as_utc(q.created_at),
        expires_at=as_utc(q.expires_at),
        spec=q.spec,
        options=options if options is not None else [PlanOption.model_validate(o) for o in q.options],
    )


def _detail(ctx: CtxDep, tenant: CurrentTenant, job_id: str) -> JobDetail:
    with ctx.session_factory() as session:
        job = job_service.get_job(session, tenant, job_id)
        return queries.job_detail(session, job)


@router.post(
    "/quotes",
    status_code=201,
    response_model=QuoteRead,
    summary="Quote a job: ranked, priced options",
    responses=error_responses(401, 409, 422),
)
def create_quote(
    ctx: CtxDep, tenant: CurrentTenant, spec: Annotated[JobSpec, Body(openapi_examples=QUOTE_EXAMPLES)]
) -> Response:
    """Plan the job on the current fleet (a sync handler: FastAPI runs it in its threadpool, off the
    event loop). Each option is a complete plan (degrees, placement, sync
    topology) with estimated duration and cost. No feasible plan → 409 with the planner's explanation."""
    quote = _quote_read(*job_service.quote_with_options(ctx, tenant.id, spec))
    # Serialised once, here: returned as a model, it would be dumped, validated again against
    # response_model and encoded (thousands of tasks per quote); the schema stays response_model's.
    return Response(content=quote.model_dump_json(), status_code=201, media_type="application/json")


@router.post(
    "/jobs",
    status_code=201,
    response_model=JobDetail,
    summary="Submit a job",
    responses=error_responses(401, 402, 404, 409, 422),
)
async def submit_job(
    request: Request,
    tenant: CurrentTenant,
    body: Annotated[JobCreate, Body(openapi_examples=JOB_EXAMPLES)],
) -> Response:
    """Accept an option of a quote (`quote_id`, `option_id`), or give a spec and a `choice`
    (cheapest | fastest | balanced). The job is stored as `queued` and returned at once with its
    `queue` position and reason; the placer then admits it by priority, fair share and submission
    time (follow `/jobs/{id}` or its events). A job that would take the tenant's spend this month
    over its cap → 402 naming the numbers."""
    ctx = request.app.state.ctx  # not a dependency: each one is resolved on every request
    request_args = {
        "spec": body.spec,
        "quote_id": body.quote_id,
        "option_id": body.option_id,
        "choice": body.choice,
    }
    if body.quote_id is None and not (body.spec and needs_resolution(body.spec)):  # drafted on the loop
        draft = submissions.draft_job(ctx, tenant.id, **request_args)
    else:  # the quote is read, or the spec's references checked, off the event loop
        draft = await run_in_threadpool(submissions.draft_job, ctx, tenant.id, **request_args)
    job = await request.app.state.submissions.submit(draft)
    ctx.metrics.submissions.labels("route").inc()
    # Already a validated JobDetail: serialised once here instead of validated again against
    # response_model (which still documents it) on every submission.
    detail = queries.submitted_job_detail(job)
    return Response(detail.model_dump_json(by_alias=True), status_code=201, media_type="application/json")


@router.get("/jobs", response_model=list[JobSummary], summary="List jobs", responses=error_responses(401))
def list_jobs(
    session: SessionDep,
    tenant: CurrentTenant,
    status: Annotated[str | None, Query(description="Only jobs in this state")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[JobSummary]:
    """Your jobs, newest first (an admin sees every tenant's)."""
    return queries.job_summaries(session, job_service.list_jobs(session, tenant, status=status, limit=limit))


@router.get(
    "/jobs/{job_id}", response_model=JobDetail, summary="A job in full", responses=error_responses(401, 404)
)
def get_job(ctx: CtxDep, tenant: CurrentTenant, job_id: str) -> JobDetail:
    """Status, tasks and placement, latest metrics, estimates against actual time and cost, result."""
    return _detail(ctx, tenant, job_id)


@router.post(
    "/jobs/{job_id}/cancel",
    response_model=JobDetail,
    summary="Cancel a job",
    responses=error_responses(401, 404, 409),
)
def cancel_job(
    ctx: CtxDep, tenant: CurrentTenant, job_id: str, body: Annotated[CancelRequest | None, Body()] = None
) -> JobDetail:
    """Stop the job's tasks and release its devices. A finished job → 409."""
    reason = (body or CancelRequest()).reason
    job_service.cancel_job(ctx, job_id, reason, tenant_id=None if tenant.is_admin else tenant.id)
    return _detail(ctx, tenant, job_id)


@router.post(
    "/jobs/{job_id}/preempt",
    status_code=202,
    response_model=JobDetail,
    summary="Preempt a job (admin)",
    responses=error_responses(401, 403, 404, 409, 422),
)
def preempt_job(
    ctx: CtxDep, admin: AdminTenant, job_id: str, body: PreemptRequest, request: Request
) -> JobDetail:
    """Ask a running (or placed) job whose spec allows it (`qos.preemptible`) to checkpoint its
    current step and stop; it then goes back to the queue and resumes from that checkpoint when
    placed again (not counted as a retry). Answers at once with the preemption under way
    (`preemption`); the job's `job.preempted` event follows once its tasks have stopped. A job
    that is not preemptible, not active, or already being preempted → 409."""
    with session_scope(ctx.session_factory) as session:
        start_preemption(
            ctx, session, job_id, reason=body.reason, by_job_id=body.by_job_id, grace_s=body.grace_s
        )
        audit_request(session, request, admin, "job.preempt", f"job {job_id}", body.model_dump())
    return _detail(ctx, admin, job_id)


@router.get(
    "/jobs/{job_id}/metrics",
    response_model=MetricSeries,
    summary="The loss curve",
    responses=error_responses(401, 404),
)
def job_metrics(
    session: SessionDep,
    tenant: CurrentTenant,
    job_id: str,
    max_points: Annotated[int, Query(ge=2, le=10_000)] = 500,
) -> MetricSeries:
    """Per-region loss and throughput by step, with the data's entropy floor when known."""
    job = job_service.get_job(session, tenant, job_id)
    return queries.metric_series(session, job, max_points)


@router.get(
    "/jobs/{job_id}/events",
    summary="Job events (server-sent events)",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {
                "text/event-stream": {"example": 'id: 7\ndata: {"id":7,"kind":"job.running",...}\n\n'}
            },
            "description": "The persisted history, then live events; a final `event: end` when the job ends",
        },
        **error_responses(401, 404, 429),
    },
)
async def job_events(
    request: Request,
    ctx: CtxDep,
    tenant: CurrentTenant,
    job_id: str,
    after: Annotated[int, Query(ge=0, le=ROW_ID_MAX, description="Only events with a larger id")] = 0,
    follow: Annotated[bool, Query(description="Keep streaming until the job ends")] = True,
    last_event_id: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> StreamingResponse:
    def check() -> None:
        with ctx.session_factory() as session:
            job_service.get_job(session, tenant, job_id)

    await asyncio.to_thread(check)
    if last_event_id and last_event_id.isdigit() and len(last_event_id) <= 10:
        after = max(after, min(int(last_event_id), ROW_ID_MAX))
    fanout: Fanout = request.app.state.fanout
    fanout.check_capacity(tenant.id)  # 429 now, not an error inside a stream that answered 200
    stream = job_event_stream(
        ctx, fanout, tenant.id, job_id, after=after, follow=follow, stopping=request.app.state.stopping
    )
    return StreamingResponse(
        stream,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@router.get(
    "/queue",
    response_model=list[QueueEntryRead],
    summary="The admission queue",
    responses=error_responses(401),
)
def queue(ctx: CtxDep, tenant: CurrentTenant) -> list[QueueEntryRead]:
    """Queued jobs in admission order with their positions (among every tenant's queued jobs) and
    why each waits: your own (an admin sees all)."""
    # A session closed inside the handler: its connection goes back to the pool before the answer
    # is sent, so a burst of reads never waits on connections held by finished requests.
    with ctx.session_factory() as session:
        return queue_entries(session, tenant)
