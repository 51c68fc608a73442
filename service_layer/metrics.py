"""``GET /metrics`` for Prometheus: request latency as it happens, and the fleet and jobs as the
database has them at scrape time (so every replica reports the same truth).

Scraping needs an admin API key as a bearer token (Prometheus' ``authorization`` setting), except
from loopback in development.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from statistics import median
from typing import Any

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from starlette.types import ASGIApp, Receive, Scope, Send

from contracts.roles import Permission
from contracts.states import JobState, TaskState
from orchestration.context import ServerContext
from orchestration.db.engine import as_utc
from orchestration.db.models import Job, Node, Task
from orchestration.ledger import wan_bytes_by_region
from service_layer.auth import authenticate
from service_layer.dashboard.access import open_without_key
from service_layer.deps import CtxDep

router = APIRouter(tags=["health"])

ESTIMATE_WINDOW = 200  # finished jobs the estimate-error gauges summarise


class RequestTimer:
    """ASGI middleware: one histogram observation per HTTP request, labelled by route template
    (``/v1/jobs/{job_id}``, not the id, so label cardinality stays bounded)."""

    def __init__(self, app: ASGIApp, ctx: ServerContext) -> None:
        self.app, self.ctx = app, ctx

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        start = time.perf_counter()

        async def send_with_status(message: dict) -> None:  # type: ignore[type-arg]
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_with_status)
        finally:
            self.ctx.metrics.requests.labels(scope["method"], route_template(scope), str(status)).observe(
                time.perf_counter() - start
            )


def route_template(scope: Scope) -> str:
    """The matched route with its parameters named (``/v1/jobs/{job_id}``); "unmatched" for a 404
    on no route, so a scanner cannot mint one label per URL it tries."""
    if scope.get("route") is None:
        return "unmatched"
    names = {str(v): k for k, v in (scope.get("path_params") or {}).items()}
    return "/".join(f"{{{names[part]}}}" if part in names else part for part in scope["path"].split("/"))


class DatabaseCollector(Collector):
    """Gauges read from the database on each scrape."""

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        with self.ctx.session_factory() as session:
            by_state = dict(session.execute(select(Job.status, func.count()).group_by(Job.status)).all())
            nodes = dict(session.execute(select(Node.status, func.count()).group_by(Node.status)).all())
            running_tasks = session.scalar(
                select(func.count()).select_from(Task).where(Task.status == TaskState.RUNNING)
            )
            finished = session.execute(
                select(Job.estimated_duration_s, Job.started_at, Job.finished_at)
                .where(Job.status == JobState.SUCCEEDED, Job.started_at.is_not(None))
                .order_by(Job.finished_at.desc())
                .limit(ESTIMATE_WINDOW)
            ).all()
            wan = wan_bytes_by_region(session)
            gpu_nodes = session.execute(
                select(Node.id, Node.device_samples).where(
                    Node.status == "alive", Node.device_samples.is_not(None)
                )
            ).all()
        yield from device_gauges(gpu_nodes)
        jobs = GaugeMetricFamily("cpn_jobs", "Jobs by state", labels=["state"])
        for state in JobState:
            jobs.add_metric([state.value], by_state.get(state.value, 0))
        yield jobs
        yield GaugeMetricFamily(
            "cpn_queue_length", "Jobs waiting for placement", value=by_state.get(JobState.QUEUED.value, 0)
        )
        node_g = GaugeMetricFamily("cpn_nodes", "Registered nodes by liveness", labels=["status"])
        for status, n in sorted(nodes.items()):
            node_g.add_metric([status], n)
        yield node_g
        yield GaugeMetricFamily("cpn_tasks_running", "Tasks reported running", value=running_tasks or 0)
        sent = CounterMetricFamily(
            "cpn_wan_bytes_sent",
            "gRPC message bytes (serialized plus the 5-byte prefix) of the sync service that the tasks' "
            "leaders sent to peer regions, by region: what egress is billed on, without TCP/IP headers",
            labels=["region"],
        )
        for region, n in sorted(wan.items()):
            sent.add_metric([region], n)
        yield sent
        errors = [
            abs(est - actual) / actual
            for est, start, end in finished
            if est is not None
            and end is not None
            and (actual := (as_utc(end) - as_utc(start)).total_seconds()) > 0
            and math.isfinite(est)
        ]
        err = GaugeMetricFamily(
            "cpn_estimate_time_relative_error",
            f"|estimated - actual| / actual job time over the last {ESTIMATE_WINDOW} succeeded jobs",
            labels=["quantile"],
        )
        if errors:
            ordered = sorted(errors)
            err.add_metric(["0.5"], median(ordered))
            err.add_metric(["0.9"], ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))])
        yield err


# (family, help, sample field, scale): a GPU node's devices as its last stored heartbeat sampled them
DEVICE_GAUGES = (
    ("cpn_device_utilization_ratio", "GPU busy share of the last sample period", "utilization", 1.0),
    ("cpn_device_memory_used_bytes", "GPU memory in use", "memory_used_gb", float(1 << 30)),
    ("cpn_device_power_watts", "GPU power draw", "power_w", 1.0),
    ("cpn_device_temperature_celsius", "GPU temperature", "temperature_c", 1.0),
)


def device_gauges(nodes: Sequence[Any]) -> Iterator[GaugeMetricFamily]:
    """Per device of every alive GPU node (labels node, device): its samples, and whether its
    health rules found a fault (cpn_device_healthy 0, the reason on the node's dashboard page)."""
    families = [
        GaugeMetricFamily(name, text, labels=["node", "device"]) for name, text, _, _ in DEVICE_GAUGES
    ]
    healthy = GaugeMetricFamily(
        "cpn_device_healthy",
        "1 unless the node's GPU health rules found a fault on the device",
        labels=["node", "device"],
    )
    for node_id, samples in nodes:
        for d in (samples or {}).get("devices", []):
            labels = [node_id, str(d.get("index"))]
            for family, (_, _, field, scale) in zip(families, DEVICE_GAUGES, strict=True):
                family.add_metric(labels, float(d.get(field, 0.0)) * scale)
            healthy.add_metric(labels, 0.0 if d.get("health") else 1.0)
    yield from families
    yield healthy


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request, ctx: CtxDep) -> Response:
    if not open_without_key(ctx.settings, request):
        header = request.headers.get("authorization", "")
        key = header[7:] if header.lower().startswith("bearer ") else None
        with ctx.session_factory() as session:
            authenticate(session, key).require(Permission.ADMINISTER)
    return Response(generate_latest(ctx.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def install_metrics(ctx: ServerContext) -> None:
    """Register the database collector with the server's registry (once, however many apps)."""
    if not any(isinstance(c, DatabaseCollector) for c in ctx.metrics.collectors):
        collector = DatabaseCollector(ctx)
        ctx.metrics.registry.register(collector)
        ctx.metrics.collectors.append(collector)
