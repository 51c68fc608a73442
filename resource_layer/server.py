"""The resource layer's gRPC server: AgentService plus the standard health and reflection services."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from orchestration.context import ServerContext
from proto.cpn.agent.v1 import agent_pb2, agent_pb2_grpc
from resource_layer.handlers import ControlHandlers
from resource_layer.servicer import AgentServicer
from resource_layer.tls import AgentTls

AGENT_SERVICE = agent_pb2.DESCRIPTOR.services_by_name["AgentService"].full_name

# Agents hold one stream open for hours: let them ping it through idle NATs and load balancers.
SERVER_OPTIONS: list[tuple[str, int]] = [
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_pings_without_data", 0),
]


class _HealthServicer(health.aio.HealthServicer):
    """Starts with the given services SERVING: ``set`` is a coroutine, and the server is built
    before the caller's loop necessarily runs."""

    def __init__(self, services: tuple[str, ...]) -> None:
        super().__init__()
        for name in services:
            self._server_status[name] = health_pb2.HealthCheckResponse.SERVING


def build_grpc_server(
    ctx: ServerContext,
    host: str,
    port: int,
    handlers: ControlHandlers | None = None,
    *,
    servicer: AgentServicer | None = None,
    tls: AgentTls | None = None,
    enrollment_only: bool = False,
) -> tuple[grpc.aio.Server, int]:
    """A configured, bound, not yet started ``grpc.aio`` server and the port it bound (``port=0``
    picks a free one). The caller runs ``await server.start()`` and ``await server.stop(grace)``.

    With ``tls`` the port speaks TLS only (mTLS when it carries a node CA); ``enrollment_only``
    builds the enrollment port of an mTLS deployment (server TLS, Register only)."""
    if servicer is None:
        if handlers is None:
            raise ValueError("build_grpc_server needs the control layer's handlers or a servicer")
        servicer = AgentServicer(ctx, handlers, tls=tls, enrollment_only=enrollment_only)
    server = grpc.aio.server(options=SERVER_OPTIONS)
    agent_pb2_grpc.add_AgentServiceServicer_to_server(servicer, server)

    health_pb2_grpc.add_HealthServicer_to_server(_HealthServicer(("", AGENT_SERVICE)), server)
    reflection.enable_server_reflection(
        (AGENT_SERVICE, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
        server,
    )
    address = f"{host}:{port}"
    if tls is None:
        bound = server.add_insecure_port(address)
    elif enrollment_only:
        bound = server.add_secure_port(address, tls.enrollment_credentials())
    else:
        bound = server.add_secure_port(address, tls.server_credentials())
    if bound == 0:
        raise OSError(f"gRPC server could not bind {host}:{port}")
    return server, bound
