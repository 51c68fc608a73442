"""The dashboard's fleet-wide pages beside the overview: the region map, the queue, costs, and
tenants with their keys. Each is a full page and a fragment its script re-fetches in place."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from sqlalchemy.orm import Session

from service_layer.dashboard import costs, queue, region_map, tenants
from service_layer.dashboard.map_svg import bandwidth_text, rate_text, region_map_svg
from service_layer.dashboard.views import REFRESH_MS, guard, templates
from service_layer.deps import CtxDep

router = APIRouter(prefix="/dashboard", include_in_schema=False)
templates.env.filters.update(bandwidth=bandwidth_text, rate=rate_text)


def _map(session: Session, ctx: CtxDep) -> dict[str, Any]:
    fleet = region_map.fleet_map(session, ctx.bus, ctx.settings.effective_link_fresh_s)
    return {"fleet": fleet, "svg": region_map_svg(fleet.regions, fleet.links)}


def _queue(session: Session, ctx: CtxDep) -> dict[str, Any]:
    return {"rows": queue.queue_rows(session)}


def _costs(session: Session, ctx: CtxDep) -> dict[str, Any]:
    by_tenant = costs.ledger_totals(session, "tenant")
    total = costs.grand_total(by_tenant)
    return {
        "by_tenant": by_tenant,
        "by_provider": costs.ledger_totals(session, "provider"),
        "total": total,
        "lines": total.lines,
    }


def _tenants(session: Session, ctx: CtxDep) -> dict[str, Any]:
    return {"tenants": tenants.tenant_rows(session)}


# page name -> (title, what its template reads)
PAGES: dict[str, tuple[str, Callable[[Session, CtxDep], dict[str, Any]]]] = {
    "map": ("Region map", _map),
    "queue": ("Queue", _queue),
    "costs": ("Costs", _costs),
    "tenants": ("Tenants and keys", _tenants),
}


def _render(request: Request, ctx: CtxDep, page: str, fragment: bool) -> Response:
    title, data = PAGES[page]
    with ctx.session_factory() as session:
        denied = guard(session, ctx, request)
        if denied is not None:
            return denied
        context = {**data(session, ctx), "page": page, "title": title, "refresh_ms": REFRESH_MS}
    return templates.TemplateResponse(request, f"_{page}.html" if fragment else "page.html", context)


def _routes(page: str) -> None:
    def full(request: Request, ctx: CtxDep) -> Response:
        return _render(request, ctx, page, fragment=False)

    def part(request: Request, ctx: CtxDep) -> Response:
        return _render(request, ctx, page, fragment=True)

    router.add_api_route(
        f"/{page}", full, methods=["GET"], response_class=HTMLResponse, name=f"dashboard-{page}"
    )
    router.add_api_route(
        f"/fragments/{page}",
        part,
        methods=["GET"],
        response_class=HTMLResponse,
        name=f"dashboard-{page}-fragment",
    )


for _page in PAGES:
    _routes(_page)
