"""Peer authentication for the sync service: only the job's own leaders may call each other.

The control plane gives every task of a job the same secret in its assignment (``sync.auth_secret``).
Every call carries the caller's region, a timestamp and HMAC-SHA256(secret, region|method|timestamp)
as gRPC metadata; the server recomputes it, refuses a bad or stale one with UNAUTHENTICATED, and
never reaches the handler. A captured header is only good for ``MAX_SKEW_S`` (and for that method);
the payload's confidentiality and integrity are TLS's job.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable
from typing import Any

import grpc

PEER_KEY, TS_KEY, MAC_KEY = "x-cpn-sync-peer", "x-cpn-sync-ts", "x-cpn-sync-mac"
MAX_SKEW_S = 300.0
PROTECTED_PREFIX = "/cpn.sync.v1.SyncService/"  # health and reflection stay open


def sign(secret: str, peer: str, method: str, ts: str) -> str:
    return hmac.new(secret.encode(), f"{peer}|{method}|{ts}".encode(), hashlib.sha256).hexdigest()


def verify(secret: str, metadata: dict[str, str], method: str, now: float | None = None) -> str | None:
    """None when the call is authentic; else why not (never the expected value)."""
    peer, ts, mac = metadata.get(PEER_KEY), metadata.get(TS_KEY), metadata.get(MAC_KEY)
    if not (peer and ts and mac):
        return "missing sync credentials"
    try:
        skew = abs((now if now is not None else time.time()) - float(ts))
    except ValueError:
        return "malformed sync timestamp"
    if not skew <= MAX_SKEW_S:
        return f"sync credentials are {skew:.0f}s off this host's clock (at most {MAX_SKEW_S:.0f}s)"
    if not hmac.compare_digest(mac, sign(secret, peer, method, ts)):
        return "bad sync credentials"
    return None


class ServerAuth(grpc.ServerInterceptor):
    def __init__(self, secret: str) -> None:
        self.secret = secret

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        method = details.method
        if not method.startswith(PROTECTED_PREFIX):
            return continuation(details)
        why = verify(self.secret, dict(details.invocation_metadata or ()), method)
        if why is None:
            return continuation(details)
        handler = continuation(details)

        def refuse(_request: Any, context: grpc.ServicerContext) -> Any:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, why)

        # Same call shape as the real handler, so gRPC accepts the replacement.
        if handler is None:
            return None
        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(refuse)
        if handler.request_streaming:
            return grpc.stream_unary_rpc_method_handler(refuse)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(refuse)
        return grpc.unary_unary_rpc_method_handler(refuse)


class _ClientCallDetails(grpc.ClientCallDetails):
    def __init__(self, base: grpc.ClientCallDetails, metadata: list[tuple[str, str]]) -> None:
        self.method = base.method
        self.timeout = base.timeout
        self.metadata = metadata
        self.credentials = base.credentials
        self.wait_for_ready = base.wait_for_ready
        self.compression = getattr(base, "compression", None)


class ClientAuth(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    def __init__(self, secret: str, peer: str) -> None:
        self.secret, self.peer = secret, peer

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        ts = f"{time.time():.3f}"
        mac = sign(self.secret, self.peer, details.method, ts)
        extra = [(PEER_KEY, self.peer), (TS_KEY, ts), (MAC_KEY, mac)]
        return _ClientCallDetails(details, list(details.metadata or ()) + extra)

    def intercept_unary_unary(self, continuation, details, request):  # noqa: ANN001, ANN201
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):  # noqa: ANN001, ANN201
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, request_iterator):  # noqa: ANN001, ANN201
        return continuation(self._details(details), request_iterator)

    def intercept_stream_stream(self, continuation, details, request_iterator):  # noqa: ANN001, ANN201
        return continuation(self._details(details), request_iterator)
