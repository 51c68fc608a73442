"""``cpn server --workers N``: N server processes sharing the REST and gRPC ports.

Python runs one request at a time per process, so this is how the API uses a machine's cores.
Each worker is a whole replica, as replicas behind a load balancer are: REST, gRPC, its own live
snapshot, and a candidate for the leader's singletons (``orchestration.leadership``), which one
of them runs. The kernel spreads new connections over the workers' sockets (SO_REUSEPORT).
PostgreSQL only: the embedded SQLite file is one process's.

The supervisor migrates and bootstraps once, holds the ports (bound, never listening, so no
connection lands on it) so that nothing else takes them, starts the workers, forwards SIGINT and
SIGTERM, and stops them all when one exits on its own: a control plane missing a worker would
refuse a share of connections, so it fails whole and its service manager restarts it. Each worker
is tied to it (``contracts.lifetime``): a supervisor killed outright, even by SIGKILL, takes its
workers with it, and they free the ports for the restart.

The workers open the REST port together (``wait_for_siblings``, a barrier over two pipes): the
kernel spreads a connection over the sockets listening when it is opened, and one stays with its
worker, so connections opened while only the first worker listened would all stay with it.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from types import FrameType

from contracts.errors import InvalidArgument
from contracts.lifetime import tied_env
from orchestration.db.engine import is_sqlite
from orchestration.settings import Settings

log = logging.getLogger(__name__)

# A worker still running this long after SIGTERM is killed, so every worker is gone within 5 s of
# the supervisor's SIGTERM. It cuts short a worker's own graceful stop where requests are still
# open (``service_layer.server``: up to 5 s for REST, then 3 s for gRPC).
STOP_GRACE_S = 4.0
START_TIMEOUT_S = 300.0  # every worker ready to listen by then, or the start fails
_SYNC_ENV = "CPN_WORKER_SYNC"  # "<ready fd>,<go fd>": the barrier's ends a worker inherits


def bind_tcp(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A TCP socket bound to ``host:port`` (0: any free port), not listening; ``reuse_port``: shared
    with the other workers of `cpn server --workers` (SO_REUSEPORT)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def reserve_port(host: str, port: int) -> socket.socket:
    """A port held for the workers to bind beside (SO_REUSEPORT); the socket never listens."""
    return bind_tcp(host, port, reuse_port=True)


def wait_for_siblings() -> None:
    """In a worker of ``cpn server --workers``: say this worker is ready to listen, then block
    until every worker is (the supervisor closes the go pipe). Elsewhere: return at once."""
    sync = os.environ.pop(_SYNC_ENV, None)
    if not sync:
        return
    ready, go = (int(fd) for fd in sync.split(","))
    try:
        os.write(ready, b"1")
    finally:
        os.close(ready)
    try:
        while os.read(go, 1):  # EOF: the supervisor released every worker
            pass
    finally:
        os.close(go)


def worker_env(settings: Settings, ports: dict[str, int], index: int) -> dict[str, str]:
    """A worker's environment: the supervisor's, with the ports it holds and its own replica id."""
    env = tied_env()  # a worker dies with its supervisor, however the supervisor ends
    env.update(
        CPN_HTTP_HOST=settings.http_host,
        CPN_HTTP_PORT=str(ports["http"]),
        CPN_GRPC_HOST=settings.grpc_host,
        CPN_GRPC_PORT=str(ports["grpc"]),
        CPN_GRPC_ENROLL_PORT=str(ports.get("enroll", settings.grpc_enroll_port)),
        CPN_WORKERS="1",
        CPN_REUSE_PORT="1",
        CPN_REPLICA_ID=f"{settings.replica_id}/w{index}",
    )
    return env


def supervise(settings: Settings, log_level: str, bootstrap: Callable[[Settings], None]) -> int:
    """Run ``settings.workers`` workers until SIGINT or SIGTERM (0) or until one exits (its code);
    ``bootstrap`` (migrate, create the admin key) runs once, before they start."""
    if is_sqlite(settings.effective_database_url):
        raise InvalidArgument(
            "workers > 1 needs PostgreSQL (CPN_DATABASE_URL): the embedded SQLite file serves one process",
            field="workers",
        )
    bootstrap(settings)
    held = {
        "http": reserve_port(settings.http_host, settings.http_port),
        "grpc": reserve_port(settings.grpc_host, settings.grpc_port),
    }
    try:
        if settings.tls_client_ca_file is not None:
            held["enroll"] = reserve_port(settings.grpc_host, settings.grpc_enroll_port)
        ports = {name: sock.getsockname()[1] for name, sock in held.items()}
        return _run(settings, ports, log_level)
    finally:
        for sock in held.values():
            sock.close()


def _run(settings: Settings, ports: dict[str, int], log_level: str) -> int:
    stopping = False
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()

    def stop(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    workers: list[subprocess.Popen[bytes]] = []
    try:
        for i in range(settings.workers):
            env = worker_env(settings, ports, i)
            env[_SYNC_ENV] = f"{ready_w},{go_r}"
            workers.append(
                subprocess.Popen(
                    [sys.executable, "-m", "cpn", "server", "--log-level", log_level],
                    env=env,
                    pass_fds=(ready_w, go_r),
                )
            )
        os.close(ready_w)
        os.close(go_r)
        ready_w = go_r = -1
        if not _all_ready(workers, ready_r, lambda: stopping):
            return 0 if stopping else 1
        os.close(go_w)  # releases every worker: they open the REST port together
        go_w = -1
        log.info(
            "%d workers (pids %s) on REST %s:%d and gRPC %s:%d",
            len(workers),
            ", ".join(str(w.pid) for w in workers),
            settings.http_host,
            ports["http"],
            settings.grpc_host,
            ports["grpc"],
        )
        while not stopping:
            exited = [w for w in workers if w.poll() is not None]
            if exited:
                code = exited[0].returncode
                log.error("worker %d exited (code %s): stopping the others", exited[0].pid, code)
                return code or 1
            time.sleep(0.2)
        return 0
    finally:
        for fd in (ready_r, ready_w, go_r, go_w):  # go first: no worker stays blocked in the barrier
            if fd >= 0:
                os.close(fd)
        _stop_all(workers)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _all_ready(workers: list[subprocess.Popen[bytes]], ready: int, stopping: Callable[[], bool]) -> bool:
    """Whether every worker said it is ready before one exited, the start timed out or a stop."""
    seen = 0
    deadline = time.monotonic() + START_TIMEOUT_S
    while seen < len(workers):
        if stopping():
            return False
        if dead := [w for w in workers if w.poll() is not None]:
            log.error("worker %d exited (code %s) while starting", dead[0].pid, dead[0].returncode)
            return False
        if time.monotonic() > deadline:
            log.error("%d of %d workers ready after %.0fs", seen, len(workers), START_TIMEOUT_S)
            return False
        readable, _, _ = select.select([ready], [], [], 0.2)
        if readable:
            seen += len(os.read(ready, len(workers)))
    return True


def _stop_all(workers: list[subprocess.Popen[bytes]]) -> None:
    for w in workers:
        if w.poll() is None:
            w.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for w in workers:
        try:
            w.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("worker %d did not stop in %.0fs: killed", w.pid, STOP_GRACE_S)
            w.kill()
            w.wait()
