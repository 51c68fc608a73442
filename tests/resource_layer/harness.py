"""A real resource-layer gRPC server on loopback, on its own event loop in a thread, that a test can
stop and start again on the same port (as a control plane restart looks to an agent)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from sqlalchemy.orm import Session, sessionmaker

from control_layer.reactions import control_handlers
from orchestration.bus import Bus, InProcessBus
from orchestration.context import ServerContext
from orchestration.db.engine import make_engine, make_session_factory
from orchestration.db.models import Job, Task, Tenant
from orchestration.settings import Settings
from resource_layer.server import build_grpc_server
from resource_layer.servicer import AgentServicer
from resource_layer.tokens import create_enrollment_token
from tests.dbtemplate import migrated_sqlite_url


class GrpcServerThread:
    def __init__(self, ctx: ServerContext, **servicer_options: Any) -> None:
        self.ctx = ctx
        self.port = 0
        self._servicer_options = servicer_options
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: grpc.aio.Server | None = None
        self._stopping: asyncio.Event | None = None
        self._grace = 0.2

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> GrpcServerThread:
        """Start serving (on the port of the previous run, after a restart)."""
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        async def serve() -> None:
            servicer = AgentServicer(self.ctx, control_handlers(), **self._servicer_options)
            self._server, self.port = build_grpc_server(self.ctx, "127.0.0.1", self.port, servicer=servicer)
            await self._server.start()
            self._stopping = asyncio.Event()
            ready.set()
            await self._stopping.wait()
            await self._server.stop(self._grace)

        def main() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(serve())
            self._loop.close()

        self._thread = threading.Thread(target=main, name="grpc-server", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("gRPC server did not start")
        return self

    def stop(self, grace: float = 0.2) -> None:
        if self._server is None or self._loop is None or self._thread is None or self._stopping is None:
            return
        self._grace = grace
        self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(10)
        assert not self._thread.is_alive(), "gRPC server did not stop"
        self._server = None

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the server's loop (e.g. to inspect servicer state)."""
        assert self._loop is not None

        async def run() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)


def sqlite_context(tmp_path: Path, **settings: Any) -> ServerContext:
    """A fresh migrated SQLite database and an in-process bus: the embedded deployment."""
    url = migrated_sqlite_url(tmp_path / "cpn.sqlite")
    values: dict[str, Any] = {
        "database_url": url,
        "data_dir": tmp_path / "data",  # the embedded artifact store's files
        "heartbeat_interval_s": 0.3,
        "heartbeat_misses": 3,
    }
    values.update(settings)
    return ServerContext(Settings(**values), make_session_factory(make_engine(url)), InProcessBus())


def enrollment_token(ctx: ServerContext, **kwargs: Any) -> str:
    with ctx.session_factory() as session, session.begin():
        _, plaintext = create_enrollment_token(session, **{"provider": "lumen", "note": "test", **kwargs})
    return plaintext


def add_task(
    session_factory: sessionmaker[Session],
    node_id: str,
    cluster_id: str,
    region: str,
    worker_config: dict[str, Any],
    device_indices: list[int] | None = None,
) -> tuple[str, str]:
    """A tenant, a placed job and one dispatched task on ``node_id``; returns (job_id, task_id)."""
    with session_factory() as session, session.begin():
        tenant = Tenant(name=f"t-{time.monotonic_ns()}")
        session.add(tenant)
        session.flush()
        job = Job(tenant_id=tenant.id, name="test", spec={}, status="placed")
        session.add(job)
        session.flush()
        task = Task(
            job_id=job.id,
            attempt=0,
            cluster_id=cluster_id,
            node_id=node_id,
            region=region,
            status="dispatched",
            device_indices=device_indices or [0],
            placement=[],
            worker_config=worker_config,
        )
        session.add(task)
        session.flush()
        return job.id, task.id


def wait_for(predicate: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


__all__ = ["Bus", "GrpcServerThread", "add_task", "enrollment_token", "sqlite_context", "wait_for"]
