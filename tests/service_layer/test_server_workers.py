"""`cpn server --workers N`: N processes share the REST and gRPC ports, each answers, all stop
together on a signal or when one dies, and die with a supervisor killed outright; SQLite refuses
more than one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.conftest import REDIS_URL, _require, postgres_unreachable, redis_unreachable
from tests.dbtemplate import create_postgres_database, drop_postgres_database_later
from tests.processes import marked_env, ports_in, wait_until_gone
from tests.service_layer.harness import ADMIN_KEY

pytestmark = pytest.mark.postgres

SERVER_PORTS = range(30800, 30850)  # no other test binds these


def _session_pids(leader: int) -> set[int]:
    """Live processes of the session ``leader`` started (start_new_session: its pid)."""
    pids = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == leader and fields[0] != "Z":
            pids.add(int(stat.parent.name))
    return pids


def _start(tmp_path: Path, url: str, http_port: int, grpc_port: int) -> tuple[subprocess.Popen[bytes], str]:
    """The supervisor, and the mark in its environment and its workers'."""
    env, mark = marked_env()
    env.update(
        CPN_DATA_DIR=str(tmp_path),
        CPN_DATABASE_URL=url,
        CPN_REDIS_URL=REDIS_URL,
        CPN_ADMIN_API_KEY=ADMIN_KEY,
        CPN_ENVIRONMENT="development",
    )
    log = open(tmp_path / "server.log", "wb")  # noqa: SIM115  # closed with the process below
    proc = subprocess.Popen(
        [sys.executable, "-m", "cpn", "server", "--port", str(http_port), "--grpc-port", str(grpc_port),
         "--workers", "2"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    return proc, mark


def _replicas_answering(http_port: int, timeout_s: float = 90.0) -> set[str]:
    """The replica ids /healthz answers with over fresh connections, once two have answered."""
    seen: set[str] = set()
    deadline = time.monotonic() + timeout_s
    while len(seen) < 2 and time.monotonic() < deadline:
        try:
            r = httpx.get(f"http://127.0.0.1:{http_port}/healthz", timeout=5)  # a new connection each
            if r.status_code == 200:
                seen.add(r.json()["replica"])
        except httpx.HTTPError:
            time.sleep(0.2)
    return seen


def test_workers_share_the_ports_and_stop_together(tmp_path: Path) -> None:
    _require(postgres_unreachable())
    _require(redis_unreachable())
    url = create_postgres_database(migrated=False)  # the supervisor migrates, once
    http_port, grpc_port = ports_in(SERVER_PORTS, 2)  # kept across the restarts
    proc, _ = _start(tmp_path, url, http_port, grpc_port)
    try:
        replicas = _replicas_answering(http_port)
        log = (tmp_path / "server.log").read_text(errors="replace")
        assert len(replicas) == 2, log
        assert all(r.endswith(("/w0", "/w1")) for r in replicas), replicas
        workers = _session_pids(proc.pid) - {proc.pid}
        assert len(workers) == 2, log
        r = httpx.get(
            f"http://127.0.0.1:{http_port}/v1/regions", headers={"Authorization": f"Bearer {ADMIN_KEY}"}
        )
        assert r.status_code == 200 and r.json() == []  # the bootstrap admin key, made once
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=10
            )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING

        # One worker dies: the supervisor stops the other and exits with a failure.
        os.kill(min(workers), signal.SIGKILL)
        assert proc.wait(60) != 0
        deadline = time.monotonic() + 30
        while _session_pids(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _session_pids(proc.pid), "a worker outlived its supervisor"
        log = (tmp_path / "server.log").read_text(errors="replace")
        assert "stopping the others" in log, log

        # Started again on the same ports, SIGTERM stops every worker and exits 0.
        proc, _ = _start(tmp_path, url, http_port, grpc_port)
        assert len(_replicas_answering(http_port)) == 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, (tmp_path / "server.log").read_text(errors="replace")
        assert not _session_pids(proc.pid)
        assert "Traceback" not in (tmp_path / "server.log").read_text(errors="replace")

        # Started again, the supervisor killed outright: its workers die with it.
        proc, mark = _start(tmp_path, url, http_port, grpc_port)
        assert len(_replicas_answering(http_port)) == 2
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(60)
        assert wait_until_gone(mark) == {}, "a worker outlived its killed supervisor"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        drop_postgres_database_later(url)


def test_sqlite_serves_one_process_only(tmp_path: Path) -> None:
    env = {**os.environ, "CPN_DATA_DIR": str(tmp_path), "CPN_ENVIRONMENT": "development"}
    env.pop("CPN_DATABASE_URL", None)
    out = subprocess.run(
        [sys.executable, "-m", "cpn", "server", "--port", "0", "--grpc-port", "0", "--workers", "2"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode != 0
    assert "workers > 1 needs PostgreSQL" in out.stderr + out.stdout
    assert "Traceback" not in out.stderr + out.stdout
