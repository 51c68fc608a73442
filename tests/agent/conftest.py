"""Real agent processes (``python -m agent``) against a real gRPC server and SQLite database."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from sqlalchemy import select

from orchestration.bus import InProcessBus
from orchestration.context import ServerContext
from orchestration.db.models import Cluster, Node
from resource_layer.liveness import node_alive_key
from tests.processes import ports_in
from tests.resource_layer.harness import GrpcServerThread, enrollment_token, sqlite_context, wait_for

REPO = Path(__file__).resolve().parents[2]
HEARTBEAT_S = 0.4
MISSES = 6  # a 2.4 s liveness TTL: tight enough to watch expire, loose enough for a loaded machine
PLANE_PORTS = range(30850, 30900)  # the serial group's planes, one test at a time; no other test binds these


@dataclass
class Plane:
    """A control plane's resource layer: database, bus, gRPC server (restartable on its port)."""

    tmp: Path
    ctx: ServerContext
    server: GrpcServerThread
    token: str

    def stop_server(self) -> None:
        self.server.stop()

    def start_server_again(self) -> None:
        """A new server on the same port with a fresh bus, as a restarted control-plane process
        would have; the database carries over."""
        port = self.server.port
        self.ctx.bus.close()
        self.ctx = ServerContext(self.ctx.settings, self.ctx.session_factory, InProcessBus())
        self.server = GrpcServerThread(self.ctx, heartbeat_db_every_s=0.5)
        self.server.port = port
        self.server.start()


@dataclass
class AgentProcess:
    proc: subprocess.Popen[bytes]
    work_dir: Path
    log_path: Path
    args: list[str] = field(default_factory=list)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def terminate(self, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def make_plane(tmp: Path) -> Plane:
    ctx = sqlite_context(tmp, heartbeat_interval_s=HEARTBEAT_S, heartbeat_misses=MISSES)
    server = GrpcServerThread(ctx, heartbeat_db_every_s=0.5)
    server.port = ports_in(PLANE_PORTS, 1)[0]  # kept when it starts again (``ports_in``)
    server.start()
    return Plane(tmp, ctx, server, enrollment_token(ctx, max_uses=10))


def close_plane(plane: Plane) -> None:
    plane.server.stop()
    plane.ctx.bus.close()


class Launcher:
    """Starts agent processes for one plane; stops them all at the end (their logs go to stderr,
    which pytest shows when a test fails)."""

    def __init__(self, plane: Plane, tmp: Path) -> None:
        self.plane, self.tmp = plane, tmp
        self.started: list[AgentProcess] = []

    def __call__(
        self,
        name: str = "a",
        token: str | None = None,
        cluster: str = "paris-1",
        region: str = "eu-west",
        env: dict[str, str] | None = None,
        measure: bool = False,
        **options: str,
    ) -> AgentProcess:
        work_dir = self.tmp / f"agent-{name}"
        work_dir.mkdir(exist_ok=True)
        args = [
            sys.executable, "-m", "agent", "--server", self.plane.server.target,
            "--token", self.plane.token if token is None else token,
            "--region", region, "--cluster", cluster, "--provider", "lumen", "--jurisdiction", "EU",
            "--devices", "cpu:2", "--price-per-device-hour", "1.5", "--sync-ports", "29600-29609",
            "--work-dir", str(work_dir), "--reconnect-max-s", "1", "--kill-grace-s", "2",
            "--allow-command-override", "--log-level", "DEBUG",
            "--no-probe-staging",  # its life is under test here; test_staging_probe.py measures
        ]  # fmt: skip
        if not measure:
            args.append("--no-measure-profile")  # its life is under test here; test_profile.py measures
        for key, value in options.items():  # a flag given "" is a switch
            args += [f"--{key.replace('_', '-')}", value] if value else [f"--{key.replace('_', '-')}"]
        log_path = work_dir / f"agent-{len(self.started)}.log"
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(
                args, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env
            )
        agent = AgentProcess(proc, work_dir, log_path, args)
        self.started.append(agent)
        return agent

    def stop_all(self) -> None:
        for agent in self.started:
            try:
                agent.terminate(timeout=15)
            except subprocess.TimeoutExpired:
                agent.kill()
            sys.stderr.write(f"\n--- {agent.log_path} ---\n{agent.log()[-6000:]}\n")


StartAgent = Launcher


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[Plane]:
    p = make_plane(tmp_path)
    yield p
    close_plane(p)


@pytest.fixture
def start_agent(plane: Plane, tmp_path: Path) -> Iterator[Launcher]:
    launcher = Launcher(plane, tmp_path)
    yield launcher
    launcher.stop_all()


@dataclass
class Shared:
    """One plane and one connected agent for the tests that only need a running node."""

    plane: Plane
    agent: AgentProcess
    node: Node


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    tmp = tmp_path_factory.mktemp("shared")
    p = make_plane(tmp)
    launcher = Launcher(p, tmp)
    try:
        agent = launcher()
        node = node_of(p)
        wait_for(lambda: p.ctx.bus.alive(node_alive_key(node.id)), timeout=30, what="the agent's stream")
        yield Shared(p, agent, node)
    finally:
        launcher.stop_all()
        close_plane(p)


def node_of(plane: Plane, cluster: str = "paris-1", timeout: float = 30.0) -> Node:
    """The node registered in ``cluster`` (waits for the agent to register)."""

    def find() -> Node | None:
        with plane.ctx.session_factory() as s:
            return s.scalars(
                select(Node).join(Cluster, Cluster.id == Node.cluster_id).where(Cluster.name == cluster)
            ).first()

    return wait_for(find, timeout=timeout, what=f"a node to register in {cluster}")
