"""Refuse NUL characters anywhere in a request's text before a handler sees them.

PostgreSQL cannot store NUL in text, so a NUL that reached a query (``quote_id``, a name, a
filter) became a 500. Every route is covered at once: the query string and path, and every string
(key or value) of a JSON body, which can carry NUL only as the escape ``\\u0000``. The answer is a
422 naming the field. Bodies are bounded by ``BodyLimit`` (outside this), and only JSON ones are
read here; a found escape is confirmed by parsing, so a literal backslash followed by "u0000" in a
string passes.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qsl, unquote

from starlette.types import ASGIApp, Message, Receive, Scope, Send

NUL = "\x00"


def nul_field(value: Any, path: str = "") -> str | None:
    """The dotted path of the first string (key or value) holding NUL in parsed JSON, else None."""
    if isinstance(value, str):
        return (path or "(root)") if NUL in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            here = f"{path}.{key}" if path else str(key)
            if NUL in str(key):
                return here.replace(NUL, "\\u0000")
            if (found := nul_field(item, here)) is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            if (found := nul_field(item, f"{path}.{i}" if path else str(i))) is not None:
                return found
    return None


def query_nul_field(query_string: bytes, path: str) -> str | None:
    """``query.<name>`` of the parameter holding NUL (the errors' usual name), "path", or None."""
    if NUL in unquote(path):
        return "path"
    for key, value in parse_qsl(query_string.decode("latin-1"), keep_blank_values=True):
        if NUL in key or NUL in value:
            return "query." + key.replace(NUL, "\\u0000")
    return None


class TextGuard:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        field = query_nul_field(scope.get("query_string", b""), scope.get("path", ""))
        if field is not None:
            await _refuse(send, field)
            return
        headers = dict(scope.get("headers") or [])
        if not headers.get(b"content-type", b"").startswith(b"application/json"):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away (or BodyLimit refused)
                await self.app(scope, _replay([message], receive), send)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if b"\\u0000" in body:
            try:
                field = nul_field(json.loads(body))
            except ValueError:
                field = None  # not JSON: the route's own validation says so
            if field is not None:
                await _refuse(send, field)
                return
        await self.app(
            scope, _replay([{"type": "http.request", "body": body, "more_body": False}], receive), send
        )


def _replay(messages: list[Message], then: Receive | None = None) -> Receive:
    """A receive that hands out ``messages`` first, then defers to ``then`` (the client's
    disconnect, which streaming responses wait for)."""
    pending = list(messages)

    async def receive() -> Message:
        if pending:
            return pending.pop(0)
        if then is not None:
            return await then()
        return {"type": "http.disconnect"}

    return receive


async def _refuse(send: Send, field: str) -> None:
    message = f"{field}: NUL characters are not allowed"
    body = json.dumps(
        {
            "code": "invalid_argument",
            "message": message,
            "details": {"errors": [{"field": field, "message": "NUL characters are not allowed"}]},
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 422,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
