"""A cap on request bodies, enforced before anything reads them (authentication included).

A declared ``Content-Length`` over the cap is refused at once with 413; a chunked body is counted
as it arrives and refused the moment it passes the cap, so no request makes the server buffer
more than the cap. Streamed uploads (``exempt``) are passed through: their routes never buffer a
body and enforce their own caps (the artifact routes: the tenant's quota, a ticket's max_bytes).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyLimit:
    def __init__(
        self, app: ASGIApp, max_bytes: int, exempt: Callable[[str, str], bool] | None = None
    ) -> None:
        self.app, self.max_bytes, self.exempt = app, max_bytes, exempt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (self.exempt and self.exempt(scope["method"], scope["path"])):
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            try:
                too_big = int(declared) > self.max_bytes
            except ValueError:
                await _refuse(send, 400, "bad_request", "Content-Length is not a number")
                return
            if too_big:
                await _refuse(send, 413, "payload_too_large", self._message(int(declared)))
                return
        seen = 0
        started = refused = False

        async def counted_receive() -> Message:
            nonlocal seen, refused
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes and not refused:
                    refused = True
                    if not started:
                        await _refuse(send, 413, "payload_too_large", self._message(seen))
                    # the app sees the client go away and stops reading; its own answer is dropped
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if refused:
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, counted_receive, guarded_send)

    def _message(self, size: int) -> str:
        return f"request body of {size} bytes exceeds the limit of {self.max_bytes} bytes"


async def _refuse(send: Send, status: int, code: str, message: str) -> None:
    body = json.dumps({"code": code, "message": message, "details": {}}).encode()
    headers: list[Any] = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
