"""The one place domain exceptions become HTTP responses (``{code, message, details}`` bodies)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from contracts.errors import (
    Aborted,
    Conflict,
    CpnError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PayloadTooLarge,
    PaymentRequired,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
)
from contracts.job_spec import is_union_tag

log = logging.getLogger(__name__)

# Most specific first: a subclass (NoFeasiblePlan) takes its base's status unless listed itself.
_STATUS: tuple[tuple[type[CpnError], int], ...] = (
    (NotFound, 404),
    (InvalidArgument, 422),
    (FailedPrecondition, 409),
    (Conflict, 409),
    (Aborted, 409),
    (ResourceExhausted, 429),
    (PaymentRequired, 402),
    (PayloadTooLarge, 413),
    (Unauthenticated, 401),
    (PermissionDenied, 403),
)


def http_status_for(exc: CpnError) -> int:
    """The HTTP status a domain exception stands for; an unmapped class is a bug, reported as 500."""
    return next((status for cls, status in _STATUS if isinstance(exc, cls)), 500)


_LOCATION_ROOTS = {"body"}  # the body is the default place; query/path locations keep their prefix


def field_path(loc: tuple[Any, ...] | list[Any]) -> str:
    parts = list(loc)
    if parts and parts[0] in _LOCATION_ROOTS:
        parts = parts[1:]
    return ".".join(str(p) for p in parts if not is_union_tag(p)) or "(body)"


def validation_errors(errors: list[dict[str, Any]]) -> list[dict[str, str]]:
    return [{"field": field_path(e.get("loc", ())), "message": str(e.get("msg", ""))} for e in errors]


def error_response(
    status: int, code: str, message: str, details: dict[str, Any] | None = None
) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    body = {"code": code, "message": message, "details": jsonable_encoder(details or {})}
    return JSONResponse(status_code=status, content=body, headers=headers)


def render_error(exc: CpnError) -> JSONResponse:
    """A domain exception's answer: its status, code, message and details."""
    if isinstance(exc, Unauthenticated):
        return error_response(401, exc.code, exc.message)
    return error_response(http_status_for(exc), exc.code, exc.message, exc.details)


async def _cpn_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, CpnError)
    return render_error(exc)


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = validation_errors(list(exc.errors()))
    message = "invalid request: " + "; ".join(f"{e['field']}: {e['message']}" for e in errors)
    return error_response(422, "invalid_argument", message, {"errors": errors})


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = {404: "not_found", 405: "method_not_allowed", 401: "unauthenticated", 403: "permission_denied"}
    response = error_response(exc.status_code, code.get(exc.status_code, "http_error"), str(exc.detail))
    response.headers.update(exc.headers or {})  # e.g. Allow on a 405
    return response


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(CpnError, _cpn_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
