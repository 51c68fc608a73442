"""The control-plane process: REST, gRPC and background loops in ONE asyncio event loop.

``serve(settings)`` is ``cpn server``: migrate, bootstrap the admin key, then run uvicorn (FastAPI),
the resource layer's gRPC server and, while this replica is the elected leader, the reaper, the
placer, the link prober and the ledger's meter, until SIGINT/SIGTERM. ``start_server_in_thread``
runs the same in a background thread for tests and the demo, and reports the ports it bound
(port 0 picks free ones).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import grpc
import uvicorn
from sqlalchemy import Engine

from control_layer.live_snapshot import attach_live_snapshot, run_live_snapshot
from control_layer.metering import run_meter
from control_layer.placer import run_placer
from control_layer.preemption import preempt_job
from control_layer.reactions import control_handlers
from control_layer.reaper import run_reaper
from orchestration.artifacts.factory import make_store
from orchestration.bus import make_bus
from orchestration.context import ServerContext
from orchestration.db.engine import is_sqlite, make_engine, make_session_factory, session_scope
from orchestration.db.migrate import upgrade
from orchestration.leadership import lead_when_elected
from orchestration.settings import Settings
from resource_layer.link_probes import run_link_prober
from resource_layer.server import build_grpc_server
from resource_layer.tls import AgentTls
from service_layer.app import create_app
from service_layer.auth import bootstrap_admin
from service_layer.workers import bind_tcp, supervise, wait_for_siblings

log = logging.getLogger(__name__)

GRPC_GRACE_S = 3.0
HTTP_GRACE_S = 5.0
# An idle kept-alive connection lives longer than clients keep theirs (httpx: 5 s), so a client
# never sends on a connection the server is closing; uvicorn's default is those same 5 s.
HTTP_KEEP_ALIVE_S = 30

ReadyCallback = Callable[[ServerContext, int, int, int | None], None]


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal handling: the runner owns SIGINT/SIGTERM for every part."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def build_context(settings: Settings) -> tuple[ServerContext, Engine]:
    engine = make_engine(settings.effective_database_url)
    # A drain moves its node's jobs by preempting them (checkpoint, stop, requeue).
    return ServerContext(
        settings=settings,
        session_factory=make_session_factory(engine),
        bus=make_bus(settings),
        preempt_job=preempt_job,
        artifact_store=make_store(settings),
    ), engine


def prepare_database(settings: Settings) -> None:
    """Create the data directory for the embedded SQLite file, then migrate to head."""
    url = settings.effective_database_url
    if settings.database_url is None or is_sqlite(url):
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    upgrade(url)


def bootstrap_once(settings: Settings) -> None:
    """Migrate and create the bootstrap admin key (what ``cpn server --workers`` does once, before
    its workers start)."""
    prepare_database(settings)
    ctx, engine = build_context(settings)
    try:
        _bootstrap(ctx)
    finally:
        ctx.bus.close()
        engine.dispose()


def _bind(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    sock = bind_tcp(host, port, reuse_port=reuse_port)
    sock.set_inheritable(True)
    return sock


def _bootstrap(ctx: ServerContext) -> None:
    key = ctx.settings.admin_api_key
    if key:
        with session_scope(ctx.session_factory) as session:
            bootstrap_admin(session, key)


async def run_singletons(ctx: ServerContext, deposed: asyncio.Event) -> None:
    """The leader's part: the reaper, the placer, the link prober and the ledger's meter (their
    writes fenced: see ``orchestration.leadership``), until ``deposed`` is set (this replica
    stopped or lost the lease)."""
    parts = [
        asyncio.create_task(run_reaper(ctx, deposed), name="reaper"),
        asyncio.create_task(run_placer(ctx, deposed), name="placer"),
        asyncio.create_task(run_link_prober(ctx, deposed), name="link-prober"),
        asyncio.create_task(run_meter(ctx, deposed), name="meter"),
    ]
    try:
        await asyncio.gather(*parts)
    finally:
        for part in parts:
            part.cancel()


def run_leadership(ctx: ServerContext, stop: asyncio.Event) -> asyncio.Task[None]:
    """Campaign for the singletons (every replica does; the embedded SQLite file has one process)."""
    settings = ctx.settings

    def changed(leading: bool) -> None:
        ctx.metrics.leader.set(1 if leading else 0)

    return asyncio.create_task(
        lead_when_elected(
            ctx.session_factory,
            stop,
            lambda deposed: run_singletons(ctx, deposed),
            holder=settings.replica_id,
            lease_s=settings.leader_lease_s,
            take_over_at_once=is_sqlite(settings.effective_database_url),
            on_change=changed,
        ),
        name="leadership",
    )


async def run_control_plane(
    settings: Settings, stop: asyncio.Event, on_ready: ReadyCallback | None = None
) -> None:
    """Run everything until ``stop`` is set (or a part fails, which is re-raised after cleanup)."""
    await asyncio.to_thread(prepare_database, settings)
    ctx, engine = build_context(settings)
    try:
        await asyncio.to_thread(_bootstrap, ctx)
        app = create_app(ctx)
        tls = AgentTls.from_settings(settings)
        http_sock = _bind(settings.http_host, settings.http_port, reuse_port=settings.reuse_port)
        grpc_servers: list[grpc.aio.Server] = []
        enroll_port: int | None = None
        try:
            grpc_server, grpc_port = build_grpc_server(
                ctx, settings.grpc_host, settings.grpc_port, control_handlers(), tls=tls
            )
            grpc_servers.append(grpc_server)
            if tls is not None and tls.mutual:
                enroll_server, enroll_port = build_grpc_server(
                    ctx, settings.grpc_host, settings.grpc_enroll_port, control_handlers(), tls=tls,
                    enrollment_only=True,
                )  # fmt: skip
                grpc_servers.append(enroll_server)
        except BaseException:
            http_sock.close()
            raise
        http = _Uvicorn(
            uvicorn.Config(
                app,
                lifespan="off",
                log_config=None,
                access_log=False,
                timeout_graceful_shutdown=HTTP_GRACE_S,
                timeout_keep_alive=HTTP_KEEP_ALIVE_S,
                # REST TLS: the same certificate as the agent port, through uvicorn's own settings
                ssl_certfile=settings.tls_cert_file,
                ssl_keyfile=settings.tls_key_file,
            )
        )
        for server in grpc_servers:
            await server.start()
        attach_live_snapshot(ctx)  # every replica keeps its own; the singletons run on the leader only
        snapshots = asyncio.create_task(run_live_snapshot(ctx, stop), name="live-snapshot")
        leadership = run_leadership(ctx, stop)
        await asyncio.to_thread(wait_for_siblings)  # with --workers: all open the port together
        serving = asyncio.create_task(http.serve(sockets=[http_sock]), name="http")
        waiting = asyncio.create_task(stop.wait(), name="stop")
        try:
            while not http.started and not serving.done():
                await asyncio.sleep(0.02)
            if http.started:
                http_port = http_sock.getsockname()[1]
                if settings.http_port == 0:  # agents' artifact URLs name the port actually bound
                    ctx.settings = ctx.settings.model_copy(update={"http_port": http_port})
                log.info(
                    "control plane up: REST %s:%d, gRPC %s:%d%s",
                    settings.http_host,
                    http_port,
                    settings.grpc_host,
                    grpc_port,
                    _tls_note(tls, enroll_port),
                )
                public = (
                    settings.public_url
                    or f"{_scheme(settings)}://{_url_host(settings.http_host)}:{http_port}"
                )
                log.info(
                    "dashboard: %s/dashboard (API docs: %s/docs)", public.rstrip("/"), public.rstrip("/")
                )
                if on_ready is not None:
                    on_ready(ctx, http_port, grpc_port, enroll_port)
            done, _ = await asyncio.wait(
                {waiting, serving, leadership, snapshots}, return_when=asyncio.FIRST_COMPLETED
            )
            for task in done - {waiting}:
                if task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
                if not stop.is_set():  # a part that ended because of the stop ended as asked
                    raise RuntimeError(f"{task.get_name()} stopped unexpectedly")
        finally:
            stop.set()
            app.state.stopping.set()  # ends open event streams so uvicorn need not wait them out
            http.should_exit = True
            waiting.cancel()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await serving
            for server in grpc_servers:
                await server.stop(GRPC_GRACE_S)
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await leadership
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await snapshots
            await app.state.submissions.close()
            await app.state.fanout.close()
            http_sock.close()
    finally:
        ctx.bus.close()
        engine.dispose()


def serve(settings: Settings) -> None:
    """``cpn server``: run until SIGINT or SIGTERM, then shut every part down cleanly (with
    ``settings.workers`` > 1, as that many worker processes: ``service_layer.workers``)."""
    if settings.workers > 1:
        level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
        code = supervise(settings, level, bootstrap_once)
        if code:
            raise SystemExit(code)
        return

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await run_control_plane(settings, stop)

    # uvloop (libuv) where installed, as uvicorn picks on its own: the transports and callbacks
    # every request and stream goes through cost a fraction of asyncio's pure-Python loop.
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(main())


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _scheme(settings: Settings) -> str:
    return "https" if settings.tls_cert_file is not None else "http"


def _tls_note(tls: AgentTls | None, enroll_port: int | None) -> str:
    if tls is None:
        return " (no TLS)"
    if enroll_port is None:
        return " (TLS)"
    return f" (mTLS; enrollment port {enroll_port})"


def _url_host(host: str) -> str:
    """Where a local client reaches a server bound to ``host`` (wildcards mean this machine)."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


@dataclass
class ServerHandle:
    """A control plane running in a background thread."""

    settings: Settings
    ctx: ServerContext
    http_port: int
    grpc_port: int
    enroll_port: int | None  # the enrollment port under mTLS
    started_at: float  # monotonic, when it was asked to start (its reaper's grace runs from about then)
    _loop: asyncio.AbstractEventLoop = field(repr=False)
    _stop: asyncio.Event = field(repr=False)
    _thread: threading.Thread = field(repr=False)

    @property
    def http_url(self) -> str:
        return f"{_scheme(self.settings)}://{_url_host(self.settings.http_host)}:{self.http_port}"

    @property
    def grpc_target(self) -> str:
        return f"{_url_host(self.settings.grpc_host)}:{self.grpc_port}"

    def stop(self, timeout_s: float = 30.0) -> None:
        if self._thread.is_alive():
            with contextlib.suppress(RuntimeError):  # loop already closed
                self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                raise TimeoutError(f"control plane did not stop within {timeout_s:.0f}s")

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def start_server_in_thread(settings: Settings, timeout_s: float = 60.0) -> ServerHandle:
    """Start the control plane in a daemon thread; return once REST and gRPC accept connections."""
    ready = threading.Event()
    box: dict[str, object] = {}

    def on_ready(ctx: ServerContext, http_port: int, grpc_port: int, enroll_port: int | None) -> None:
        box.update(
            ctx=ctx,
            http_port=http_port,
            grpc_port=grpc_port,
            enroll_port=enroll_port,
            loop=asyncio.get_running_loop(),
        )
        ready.set()

    def run() -> None:
        async def main() -> None:
            stop = asyncio.Event()
            box["stop"] = stop
            await run_control_plane(settings, stop, on_ready)

        try:
            asyncio.run(main())
        except BaseException as exc:
            box["error"] = exc
            log.exception("control plane thread failed")
        finally:
            ready.set()

    thread = threading.Thread(target=run, name="cpn-control-plane", daemon=True)
    started_at = time.monotonic()
    thread.start()
    if not ready.wait(timeout_s):
        raise TimeoutError(f"control plane did not start within {timeout_s:.0f}s")
    if "ctx" not in box:
        error = box.get("error")
        if isinstance(error, BaseException):
            raise RuntimeError(f"control plane failed to start: {error}") from error
        raise RuntimeError("control plane failed to start")
    return ServerHandle(
        settings=settings,
        ctx=box["ctx"],  # type: ignore[arg-type]
        http_port=box["http_port"],  # type: ignore[arg-type]
        grpc_port=box["grpc_port"],  # type: ignore[arg-type]
        enroll_port=box["enroll_port"],  # type: ignore[arg-type]
        started_at=started_at,
        _loop=box["loop"],  # type: ignore[arg-type]
        _stop=box["stop"],  # type: ignore[arg-type]
        _thread=thread,
    )
