"""Workers' log lines of a job: a page (JSON or text), or followed as server-sent events."""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import PlainTextResponse, Response, StreamingResponse

from contracts.errors import InvalidArgument
from control_layer import jobs as job_service
from orchestration.logs import store
from service_layer.deps import CtxDep, CurrentTenant
from service_layer.fanout import Fanout
from service_layer.log_stream import job_log_stream, resolve_task, text_line, to_api
from service_layer.schemas.common import error_responses
from service_layer.schemas.logs import LOG_EXAMPLE, LogPage

router = APIRouter(tags=["jobs"])

MAX_LINES = 10_000
MAX_SEQ = (1 << 63) - 1


@router.get(
    "/jobs/{job_id}/logs",
    response_model=LogPage,
    summary="The job's workers' log lines (follow: server-sent events)",
    responses={
        200: {
            "content": {
                "application/json": {"example": LOG_EXAMPLE},
                "text/plain": {
                    "example": "[5a1e9c0d/eu-west stdout] resumed from step 200 (own checkpoint)\n"
                },
                "text/event-stream": {
                    "example": 'id: 4181\ndata: {"seq":4181,"task_id":"5a1e...","line":"..."}\n\n'
                    'event: end\ndata: {"status":"succeeded"}\n\n'
                },
            },
            "description": "A page of lines; with `follow=1` the lines, then live ones, then `event: end`",
        },
        **error_responses(401, 404, 422, 429),
    },
)
async def job_logs(
    request: Request,
    ctx: CtxDep,
    tenant: CurrentTenant,
    job_id: str,
    task: Annotated[
        str | None,
        Query(
            min_length=4,
            max_length=32,
            pattern=r"^[0-9a-f]+$",
            description="Only this task's lines: its id or a unique prefix (default: every task's)",
        ),
    ] = None,
    tail: Annotated[
        int | None, Query(ge=1, le=MAX_LINES, description="Only the last N lines (after `after`)")
    ] = None,
    after: Annotated[int, Query(ge=0, le=MAX_SEQ, description="Only lines with a larger seq")] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_LINES, description="At most this many lines a page")] = 1000,
    follow: Annotated[bool, Query(description="Stream as server-sent events until the job ends")] = False,
    format: Annotated[
        Literal["json", "text"], Query(description="The page as JSON or as plain text")
    ] = "json",
    last_event_id: Annotated[str | None, Header(include_in_schema=False, max_length=32)] = None,
) -> Response:
    """Lines are ordered by `seq` across the job's tasks (the order they reached the control plane).
    Each task keeps its newest lines within `CPN_LOG_MAX_LINES_PER_TASK` / `..._BYTES_PER_TASK`;
    older ones are replaced by one marker line (`stream: cpn`, `dropped: N`)."""
    if follow and format == "text":
        raise InvalidArgument(
            "format: a followed stream is server-sent events; drop format=text", field="format"
        )

    def page() -> tuple[str | None, LogPage]:
        with ctx.session_factory() as session:
            job = job_service.get_job(session, tenant, job_id)
            task_id = resolve_task(session, job_id, task)
            if follow:
                return task_id, LogPage(
                    job_id=job_id, status=job.status, lines=[], next_after=after, more=False
                )
            rows = store.read(session, job_id, task_id=task_id, after=after, tail=tail, limit=limit)
            lines = [to_api(r) for r in rows]
            return task_id, LogPage(
                job_id=job_id,
                status=job.status,
                lines=lines,
                next_after=lines[-1].seq if lines else after,
                more=tail is None and len(lines) == limit,
            )

    task_id, result = await asyncio.to_thread(page)
    if follow:
        if last_event_id and last_event_id.isdigit():  # a resumed stream: everything after it
            after, tail = max(after, min(int(last_event_id), MAX_SEQ)), None
        fanout: Fanout = request.app.state.fanout
        fanout.check_capacity(tenant.id)  # 429 now, not an error inside a stream that answered 200
        stream = job_log_stream(
            ctx,
            fanout,
            tenant.id,
            job_id,
            task_id=task_id,
            after=after,
            tail=tail,
            stopping=request.app.state.stopping,
        )
        return StreamingResponse(
            stream,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    if format == "text":
        body = "".join(text_line(line) + "\n" for line in result.lines)
        headers = {"X-Cpn-Next-After": str(result.next_after), "X-Cpn-More": str(result.more).lower()}
        return PlainTextResponse(body, headers=headers)
    return Response(result.model_dump_json(), media_type="application/json")
