"""The FastAPI application: routers under /v1, the health check, the dashboard, one error mapping."""

from __future__ import annotations

import asyncio

from fastapi import FastAPI
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles

from control_layer.submissions import SubmissionBatcher
from orchestration.context import ServerContext
from service_layer.body_limit import BodyLimit
from service_layer.dashboard.pages import router as dashboard_pages_router
from service_layer.dashboard.views import HERE as DASHBOARD_DIR
from service_layer.dashboard.views import router as dashboard_router
from service_layer.errors import install_error_handlers
from service_layer.fanout import Fanout
from service_layer.fast_submit import FastSubmit
from service_layer.key_cache import KeyCache
from service_layer.metrics import RequestTimer, install_metrics
from service_layer.metrics import router as metrics_router
from service_layer.routers import access, admin, artifacts, health, jobs, ledger, logs, nodes, resources
from service_layer.schemas.common import error_responses
from service_layer.text_guard import TextGuard

API_PREFIX = "/v1"

DESCRIPTION = """
The service layer of a compute-power network: quote a training job (ranked, priced options over
the live fleet), submit it, and follow it. Authenticate with a tenant API key:
`Authorization: Bearer cpn_...`. Each key has a role: member (its tenant's jobs), tenant-admin (and
its tenant's keys), operator (the fleet: nodes, links, enrollment tokens) or admin (everything); a
route a role may not use answers 403 naming the roles that may. Errors are
`{code, message, details}`; a 422 lists each bad field in `details.errors`. Any request may get a
400 (a malformed `Content-Length`) or a 413 (a body over the server's limit, checked before
authentication; artifact uploads stream and have their own limits).
"""


def create_app(ctx: ServerContext) -> FastAPI:
    app = FastAPI(
        title="cpn",
        version="1",
        description=DESCRIPTION,
        # The body limit answers before any route: every operation can return these.
        responses=error_responses(400, 413),
        openapi_tags=[
            {"name": "jobs", "description": "Quotes, jobs, their metrics and events"},
            {"name": "resources", "description": "Regions, clusters, nodes, devices, links"},
            {
                "name": "admin",
                "description": "Tenants, audit, calibration: admin; tokens, snapshot: operators too",
            },
            {"name": "access", "description": "API keys with roles; enrollment tokens"},
            {"name": "nodes", "description": "Cordon, drain, revoke nodes: operators and admins"},
            {
                "name": "artifacts",
                "description": "Users' code, data and models by SHA-256; agents' reads and writes by ticket",
            },
            {"name": "ledger", "description": "Charges, monthly invoices and provider payout statements"},
            {"name": "health", "description": "Liveness of the database and bus"},
        ],
    )
    submit = next(r for r in jobs.router.routes if getattr(r, "endpoint", None) is jobs.submit_job)
    app.add_middleware(FastSubmit, path=f"{API_PREFIX}/jobs", route=submit)  # inside the limit and timer
    app.add_middleware(TextGuard)  # inside the limit: reads only bounded JSON bodies
    app.add_middleware(
        BodyLimit, max_bytes=ctx.settings.max_body_bytes, exempt=artifacts.streamed_upload
    )  # uploads stream, bounded by their own routes
    app.add_middleware(RequestTimer, ctx=ctx)  # outermost: times every request, refused ones too
    install_metrics(ctx)
    app.state.ctx = ctx
    app.state.stopping = asyncio.Event()  # set by the server runner: ends open event streams
    app.state.key_cache = KeyCache()  # verified API keys, a few seconds each
    app.state.fanout = Fanout(ctx.bus, max_per_tenant=ctx.settings.max_streams_per_tenant)
    app.state.submissions = SubmissionBatcher(ctx)  # group commit of concurrent submissions
    install_error_handlers(app)
    routers = (jobs, artifacts, logs, resources, admin, access, nodes, ledger)
    for r in (module.router for module in routers):
        app.include_router(r, prefix=API_PREFIX)
    app.include_router(health.router)
    app.include_router(metrics_router)
    app.include_router(dashboard_router)
    app.include_router(dashboard_pages_router)
    app.mount(
        "/dashboard/static", StaticFiles(directory=str(DASHBOARD_DIR / "static")), name="dashboard-static"
    )

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse("/dashboard")

    return app
