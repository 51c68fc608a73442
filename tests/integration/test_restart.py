"""A control plane killed outright mid-job and started again on the same PostgreSQL + Redis loses no
work: `cpn server` runs as a process, `cpn agent` processes and their torchrun workers keep training
across two regions while it is away, reconnect, replay what it missed, and the job succeeds on its
first attempt with no task failed."""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from orchestration.bus import RedisBus, default_prefix
from orchestration.db.base import utcnow
from orchestration.db.engine import as_utc, make_engine, make_session_factory
from orchestration.db.models import Event, Node, TaskMetric
from orchestration.settings import Settings
from service_layer.cli.demo import wait_for_clusters
from service_layer.cli.local_fleet import LocalAgent, enroll, start_agents, stop_agents
from tests.conftest import (
    REDIS_URL,
    create_postgres_database,
    drop_postgres_database,
    postgres_unreachable,
    redis_unreachable,
)
from tests.integration.test_end_to_end import TERMINAL, job_spec, wait_job, wait_training
from tests.processes import ports_in

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(420)]

HEARTBEAT_S = 1.0
MISSES = 3
# Long enough to be training still when the control plane is back: it is away node_lost_after_s
# + 1 s, then starts and hears every agent (about 8 s in all); a fast host (0.48 s loop) trained
# 400 steps within that, so 1,000 leave it twice the margin.
STEPS = 1000
UP = re.compile(r"control plane up: REST \S+:(\d+), gRPC \S+:(\d+)")


# The server's ports, kept across its restart: below the kernel's ephemeral range (32768 up on
# Linux), where an outgoing connection of another test can take a port while the server is down
# (a restart found its gRPC port taken so), and past this test's agents' sync ports (31500-31599);
# the jobs group runs its tests one at a time (tests/conftest.py), test_measuring's server too.
SERVER_PORTS = range(31650, 31700)


def server_ports(n: int) -> list[int]:
    return ports_in(SERVER_PORTS, n)


@dataclass
class ServerProcess:
    """`cpn server` as a child process on fixed ports, restartable on the same database and Redis."""

    env: dict[str, str]
    http_port: int
    grpc_port: int
    log_dir: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def start(self, timeout_s: float = 90.0) -> float:
        """Start and wait until it serves; returns the seconds that took."""
        self.starts += 1
        log_path = self.log_dir / f"server-{self.starts}.log"
        began = time.monotonic()
        with open(log_path, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "cpn", "server",
                 "--port", str(self.http_port), "--grpc-port", str(self.grpc_port)],
                env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        while not UP.search(log_path.read_text(errors="replace")):
            assert self.proc.poll() is None, "server exited:\n" + log_path.read_text(errors="replace")
            assert time.monotonic() - began < timeout_s, "server not up:\n" + log_path.read_text()
            time.sleep(0.05)
        return time.monotonic() - began

    def kill(self) -> None:
        assert self.proc is not None and self.proc.poll() is None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def logs(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(self.log_dir.glob("server-*.log")))


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[ServerProcess, httpx.Client, Settings]]:
    for reason in (postgres_unreachable(), redis_unreachable()):
        if reason:
            pytest.skip(reason)
    url = create_postgres_database()
    admin_key = "cpn_admin_" + secrets.token_urlsafe(16)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CPN_")}
    env.update(
        CPN_ENVIRONMENT="development", CPN_DATABASE_URL=url, CPN_REDIS_URL=REDIS_URL,
        CPN_DATA_DIR=str(tmp_path), CPN_ADMIN_API_KEY=admin_key, CPN_HEARTBEAT_INTERVAL_S=str(HEARTBEAT_S),
        CPN_HEARTBEAT_MISSES=str(MISSES), PYTHONUNBUFFERED="1",
    )  # fmt: skip
    settings = Settings(
        database_url=url, redis_url=REDIS_URL, heartbeat_interval_s=HEARTBEAT_S, heartbeat_misses=MISSES
    )
    logs = tmp_path / "server-logs"
    logs.mkdir()
    proc = ServerProcess(env, *server_ports(2), logs)
    startup = proc.start()
    sys.stderr.write(f"control plane start-up (first): {startup:.2f}s\n")
    client = httpx.Client(
        base_url=f"http://127.0.0.1:{proc.http_port}",
        headers={"Authorization": f"Bearer {admin_key}"},
        timeout=30,
    )
    try:
        yield proc, client, settings
    finally:
        client.close()
        proc.stop()
        sys.stderr.write(proc.logs()[-8000:])
        bus = RedisBus(REDIS_URL, prefix=default_prefix(settings))
        bus.delete_prefixed()
        bus.close()
        drop_postgres_database(url)


def test_kill_9_and_restart_mid_job_fails_no_task(server: tuple[ServerProcess, httpx.Client, Settings],
                                                  tmp_path: Path) -> None:  # fmt: skip
    proc, client, settings = server
    specs = [
        # Restart safety is under test, not pricing: the agents register without measuring.
        LocalAgent("eu-west", "paris-1", "lumen", 1.0, "EU", measure_profile=False),
        LocalAgent("us-east", "virginia-1", "atlas", 2.0, "US", measure_profile=False),
    ]
    tokens = enroll(client, specs, note="restart")
    agents = start_agents(specs, f"127.0.0.1:{proc.grpc_port}", tokens, tmp_path, first_port=31500)
    engine = make_engine(settings.effective_database_url)
    session_factory = make_session_factory(engine)
    try:
        wait_for_clusters(client, len(specs), timeout_s=90)
        client.put(
            "/v1/links",
            json={"src": "eu-west", "dst": "us-east", "bandwidth_gbps": 1.0, "latency_ms": 40.0,
                  "egress_price_per_gb": 0.02},
        ).raise_for_status()  # fmt: skip
        job = client.post("/v1/jobs", json={"spec": job_spec(STEPS), "choice": "cheapest"}).raise_for_status()
        job_id = job.json()["id"]
        running = wait_training(client, job_id, min_step=2, timeout_s=180)
        assert {t["region"] for t in running["tasks"]} == {"eu-west", "us-east"}

        proc.kill()
        # Away long enough for every liveness key to expire, as in a slow restart.
        time.sleep(settings.node_lost_after_s + 1.0)
        restarted_at = utcnow()
        startup = proc.start()
        up_at = time.monotonic()
        with session_factory() as session:
            node_ids = list(session.scalars(select(Node.id)))
        assert len(node_ids) == len(specs)

        def heard_since_restart() -> bool:
            with session_factory() as session:
                rows = session.scalars(select(Node).where(Node.id.in_(node_ids))).all()
                return all(
                    r.last_heartbeat_at is not None and as_utc(r.last_heartbeat_at) >= restarted_at
                    for r in rows
                )

        while not heard_since_restart():
            # A ceiling, not a target: what matters is below (no task failed, the job carried on).
            assert time.monotonic() - up_at < 120, "agents did not reconnect"
            time.sleep(0.05)
        reconnect = time.monotonic() - up_at
        back = client.get(f"/v1/jobs/{job_id}").raise_for_status().json()
        assert back["status"] == "running", "the job ended while the control plane was away: raise STEPS"
        sys.stderr.write(f"control plane start-up (restart): {startup:.2f}s; all agents back {reconnect:.2f}s"
                         f" after it was up (loss threshold {settings.node_lost_after_s:g}s)\n")  # fmt: skip

        done = wait_job(client, job_id, TERMINAL, timeout_s=240)
        assert done["status"] == "succeeded", done["reason"]
        assert done["attempt"] == 1, "the job was re-placed"
        assert all(t["status"] == "succeeded" for t in done["tasks"]), done["tasks"]
        with session_factory() as session:
            kinds = Counter(session.scalars(select(Event.kind)))
            steps = Counter(session.execute(select(TaskMetric.task_id, TaskMetric.step)).all())
        assert kinds["task.failed"] == 0 and kinds["node.lost"] == 0, kinds
        assert steps and max(steps.values()) == 1, "a replayed metric was stored twice"
        series = client.get(f"/v1/jobs/{job_id}/metrics").raise_for_status().json()["series"]
        assert {r: points[-1]["step"] for r, points in series.items()} == {"eu-west": STEPS, "us-east": STEPS}
    finally:
        stop_agents(agents)
        engine.dispose()
        for spec in specs:
            log = tmp_path / f"agent-{spec.region}-{spec.cluster}" / "agent.log"
            if log.exists():
                sys.stderr.write(f"--- {log} ---\n{log.read_text(errors='replace')[-3000:]}\n")
