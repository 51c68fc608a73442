"""``POST /v1/jobs`` on a short path: a submission burst's common case without the framework's
routing, dependency resolution and body handling, which cost more than the submission itself.

The short path answers a spec submission (no quote) whose key is in the cache of verified keys
(``service_layer.key_cache``) with the run-jobs permission and whose body validates, with the
functions the route uses: ``JobCreate``, ``draft_job``, the submission batcher,
``submitted_job_detail`` and the one error renderer (a refusal: 402, 404). Anything else (no key,
a key not verified in the last few seconds, another role, a quote acceptance, a body that does not
parse or validate) goes on to the route with its body replayed, so the route's answers, errors
and documentation stay the reference; the route's tests exercise both paths.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from contracts.errors import CpnError
from contracts.roles import Permission
from control_layer.submissions import draft_job
from control_layer.user_data import needs_resolution
from service_layer.auth import hash_key
from service_layer.errors import render_error
from service_layer.queries import submitted_job_detail
from service_layer.schemas.jobs import JobCreate

_BEARER = b"bearer "


class FastSubmit:
    """ASGI middleware serving the common case of ``path`` (POST); the rest passes through."""

    def __init__(self, app: ASGIApp, path: str, route: Any) -> None:
        # ``route``: the route this path stands for, set in the scope of the requests answered
        # here as the router sets it, so the request metrics label both paths alike.
        self.app, self.path, self.route = app, path, route

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != self.path:
            await self.app(scope, receive, send)
            return
        state = scope["app"].state
        principal = _cached_principal(scope, state.key_cache)
        if principal is None:
            await self.app(scope, receive, send)
            return
        body, more = await _read_body(receive)
        create = _spec_submission(body) if more is None else None
        if create is None or needs_resolution(create.spec):  # references to check: off the loop
            await self.app(scope, _replay(body, more, receive), send)
            return
        scope["route"] = self.route
        try:
            draft = draft_job(state.ctx, principal.id, spec=create.spec, choice=create.choice)
            job = await state.submissions.submit(draft)
        except CpnError as exc:
            await render_error(exc)(scope, receive, send)
            return
        state.ctx.metrics.submissions.labels("short").inc()
        answer = submitted_job_detail(job).model_dump_json(by_alias=True).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())]
        await send({"type": "http.response.start", "status": 201, "headers": headers})
        await send({"type": "http.response.body", "body": answer})


def _cached_principal(scope: Scope, key_cache: Any) -> Any:
    """The principal of the request's key if it was verified in the last seconds and may run jobs."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            if value[:7].lower() != _BEARER:
                return None
            principal = key_cache.get(hash_key(value[7:].decode("latin-1").strip()))
            return principal if principal is not None and principal.can(Permission.RUN_JOBS) else None
    return None


async def _read_body(receive: Receive) -> tuple[bytes, Message | None]:
    """The whole body, or what was read and the message that ended the reading early (a
    disconnect, or a refusal of the body limit), for the route to see."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), message
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), None


def _spec_submission(body: bytes) -> JobCreate | None:
    """The body as a spec submission, validated as the route validates it (parsed JSON, then the
    model); None for anything the route should answer itself."""
    try:
        create = JobCreate.model_validate(json.loads(body))
    except (ValueError, ValidationError):
        return None
    return create if create.quote_id is None and create.spec is not None else None


def _replay(body: bytes, ended: Message | None, receive: Receive) -> Receive:
    """``receive`` with what was already read given first."""
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": ended is not None}]
    if ended is not None:
        pending.append(ended)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed
