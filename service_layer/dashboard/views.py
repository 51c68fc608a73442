"""Dashboard pages and the fragments their script re-fetches (admin view: every tenant's jobs)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from sqlalchemy import select
from sqlalchemy.orm import Session

from contracts.errors import CpnError, PermissionDenied, Unauthenticated
from contracts.states import JOB_TERMINAL
from orchestration.db.models import CalibrationChange, CalibrationFactor, Job
from orchestration.logs import store as task_logs
from service_layer import queries
from service_layer.dashboard import accuracy, region_map
from service_layer.dashboard.access import COOKIE, COOKIE_TTL_S, admin_from_key, check_access, make_cookie
from service_layer.dashboard.map_svg import region_map_svg
from service_layer.dashboard.spread_svg import spread_curve_svg
from service_layer.dashboard.svg import loss_curve_svg
from service_layer.deps import CtxDep
from service_layer.log_stream import to_api

HERE = Path(__file__).resolve().parent
templates = Jinja2Templates(directory=str(HERE / "templates"))
router = APIRouter(prefix="/dashboard", include_in_schema=False)

JOBS_SHOWN = 50
ACCURACY_JOBS = 500  # the accuracy panel summarises the newest this many ended jobs
ERRORS_SHOWN = 20  # newest time/cost errors in the calibration panel
REFRESH_MS = 2000
LOG_LINES_SHOWN = 100  # the job page's logs panel: the newest lines of every task


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    s = max(0, int(seconds))
    return f"{s}s ago" if s < 120 else f"{s // 60}m ago" if s < 7200 else f"{s // 3600}h ago"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    if seconds < 10:
        return f"{seconds:.1f}s"
    s = int(round(seconds))
    return (
        f"{s}s"
        if s < 120
        else f"{s // 60}m {s % 60:02d}s"
        if s < 7200
        else f"{s // 3600}h {s % 3600 // 60:02d}m"
    )


def _money(v: float | None) -> str:
    return "–" if v is None else f"${v:,.6f}" if v < 1 else f"${v:,.2f}"


def _when(dt: datetime | None) -> str:
    return "–" if dt is None else dt.strftime("%Y-%m-%d %H:%M:%S UTC")


templates.env.filters.update(age=_age, duration=_duration, money=_money, when=_when)


def _login(request: Request, status: int, message: str, next_path: str) -> HTMLResponse:
    return templates.TemplateResponse(
        request, "login.html", {"message": message, "next": next_path}, status_code=status
    )


def guard(session: Session, ctx: CtxDep, request: Request) -> Response | None:
    """None when the request may proceed; else the login page (or a bare 401/403 for fragments)."""
    try:
        check_access(session, ctx.settings, request)
        return None
    except (Unauthenticated, PermissionDenied) as exc:
        status = 401 if isinstance(exc, Unauthenticated) else 403
        if "/fragments/" in request.url.path or request.url.path.endswith("/live"):
            return Response(exc.message, status_code=status, media_type="text/plain")
        return _login(request, status, exc.message, request.url.path)


def _overview(session: Session, ctx: CtxDep) -> dict[str, Any]:
    jobs = list(session.scalars(select(Job).order_by(Job.created_at.desc()).limit(JOBS_SHOWN)))
    records = session.scalars(
        select(Job.accuracy)
        .where(Job.accuracy.is_not(None))
        .order_by(Job.created_at.desc())
        .limit(ACCURACY_JOBS)
    ).all()
    factors = session.scalars(
        select(CalibrationFactor).order_by(CalibrationFactor.kind, CalibrationFactor.key)
    )
    errors = session.scalars(
        select(CalibrationChange)
        .where(CalibrationChange.kind.in_(("time", "cost")))
        .order_by(CalibrationChange.id.desc())
        .limit(ERRORS_SHOWN)
    )
    return {
        "regions": queries.list_regions(session),
        "clusters": queries.list_clusters(session, ctx.bus),
        "links": queries.list_links(session, ctx.settings.effective_link_fresh_s),
        "jobs": queries.job_summaries(session, jobs),
        "accuracy": accuracy.summary(records),
        "factors": list(factors),
        "errors": list(errors),
        "refresh_ms": REFRESH_MS,
    }


def _job_context(session: Session, ctx: CtxDep, job: Job) -> dict[str, Any]:
    detail = queries.job_detail(session, job)
    # The fleet map with this job's devices and sync drawn over it.
    fleet = region_map.fleet_map(session, ctx.bus, ctx.settings.effective_link_fresh_s)
    placement_svg = region_map_svg(fleet.regions, fleet.links, region_map.job_overlay(detail))
    series = queries.metric_series(session, job, max_points=400)
    total = int((job.spec.get("training") or {}).get("steps", 0)) or None
    svg = loss_curve_svg(
        {r: [(p.step, p.loss) for p in pts] for r, pts in series.series.items()},
        floor=series.entropy_floor,
        uniform=series.uniform_loss,
        total_steps=total,
    )
    # Gossip jobs: how far the regions' models are from one model, at each spread check.
    spread_svg = (
        spread_curve_svg(
            {r: [(p.step, p.spread) for p in pts] for r, pts in series.spread.items()}, total_steps=total
        )
        if series.spread or (job.spec.get("sync") or {}).get("mode") == "gossip"
        else None
    )
    return {
        "job": detail,
        "breakdown": accuracy.breakdown(job.accuracy),
        "svg": svg,
        "spread_svg": spread_svg,
        "placement_svg": placement_svg,
        "series": series,
        "final": job.status in JOB_TERMINAL,
        "refresh_ms": REFRESH_MS,
    }


def _logs_context(session: Session, job: Job) -> dict[str, Any]:
    rows = task_logs.read(session, job.id, tail=LOG_LINES_SHOWN)
    return {
        "lines": [to_api(r) for r in rows],
        "shown": LOG_LINES_SHOWN,
        "job_id": job.id,
        "final": job.status in JOB_TERMINAL,
    }


@router.get("", response_class=HTMLResponse)
def index(request: Request, ctx: CtxDep) -> Response:
    with ctx.session_factory() as session:
        denied = guard(session, ctx, request)
        if denied is not None:
            return denied
        return templates.TemplateResponse(request, "index.html", _overview(session, ctx))


@router.get("/fragments/overview", response_class=HTMLResponse)
def overview_fragment(request: Request, ctx: CtxDep) -> Response:
    with ctx.session_factory() as session:
        denied = guard(session, ctx, request)
        if denied is not None:
            return denied
        return templates.TemplateResponse(request, "_overview.html", _overview(session, ctx))


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(request: Request, ctx: CtxDep, job_id: str) -> Response:
    with ctx.session_factory() as session:
        denied = guard(session, ctx, request)
        if denied is not None:
            return denied
        job = session.get(Job, job_id)
        if job is None:
            return templates.TemplateResponse(request, "missing.html", {"job_id": job_id}, status_code=404)
        context = {**_job_context(session, ctx, job), **_logs_context(session, job)}
        return templates.TemplateResponse(request, "job.html", context)


@router.get("/jobs/{job_id}/live", response_class=HTMLResponse)
def job_fragment(request: Request, ctx: CtxDep, job_id: str) -> Response:
    with ctx.session_factory() as session:
        denied = guard(session, ctx, request)
        if denied is not None:
            return denied
        job = session.get(Job, job_id)
        if job is None:
            return Response("job not found", status_code=404, media_type="text/plain")
        return templates.TemplateResponse(request, "_job_live.html", _job_context(session, ctx, job))


@router.get("/fragments/jobs/{job_id}/logs", response_class=HTMLResponse)
def job_logs_fragment(request: Request, ctx: CtxDep, job_id: str) -> Response:
    with ctx.session_factory() as session:
        denied = guard(session, ctx, request)
        if denied is not None:
            return denied
        job = session.get(Job, job_id)
        if job is None:
            return Response("job not found", status_code=404, media_type="text/plain")
        return templates.TemplateResponse(request, "_job_logs.html", _logs_context(session, job))


def _node_context(session: Session, ctx: CtxDep, node_id: str) -> dict[str, Any] | None:
    """One node as the overview lists it, its devices beside their latest samples (GPU nodes)."""
    for cluster in queries.list_clusters(session, ctx.bus):
        for node in cluster.nodes:
            if node.id == node_id:
                samples = {d.get("index"): d for d in (node.device_samples or {}).get("devices", [])}
                rows = [(d, samples.get(d.index)) for d in node.devices]
                return {"node": node, "cluster": cluster, "rows": rows, "refresh_ms": REFRESH_MS}
    return None


@router.get("/nodes/{node_id}", response_class=HTMLResponse)
def node_page(request: Request, ctx: CtxDep, node_id: str) -> Response:
    with ctx.session_factory() as session:
        denied = guard(session, ctx, request)
        if denied is not None:
            return denied
        context = _node_context(session, ctx, node_id)
        if context is None:
            return templates.TemplateResponse(
                request, "missing.html", {"what": "node", "job_id": node_id}, status_code=404
            )
        return templates.TemplateResponse(request, "node.html", context)


@router.post("/login", response_class=HTMLResponse)
async def log_in(request: Request, ctx: CtxDep) -> Response:
    """The sign-in form posts the key here (never in a URL, so it stays out of history and logs);
    a good admin key sets the cookie and redirects to the page the form came from."""
    form = parse_qs((await request.body()).decode("utf-8", "replace"), max_num_fields=4)
    key = (form.get("key") or [""])[0]
    path = _safe_next((form.get("next") or ["/dashboard"])[0])
    with ctx.session_factory() as session:
        try:
            tenant = admin_from_key(session, key)
        except CpnError as exc:
            return _login(request, 403 if isinstance(exc, PermissionDenied) else 401, exc.message, path)
    response = RedirectResponse(path, status_code=303)
    response.set_cookie(
        COOKIE,
        make_cookie(ctx.settings, tenant.key_id),
        max_age=COOKIE_TTL_S,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/dashboard",
    )
    return response


def _safe_next(path: str) -> str:
    """Only a dashboard path: a sign-in never redirects off-site."""
    return path if path.startswith("/dashboard") and "//" not in path and "\\" not in path else "/dashboard"
