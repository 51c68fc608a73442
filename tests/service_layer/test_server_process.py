"""`cpn server` as a process: migrates, serves REST and gRPC from one loop, stops cleanly on a signal."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from typer.testing import CliRunner

from cpn.cli import app
from orchestration.db.migrate import current_revision, head_revision
from tests.service_layer.harness import ADMIN_KEY

UP = re.compile(r"control plane up: REST (\S+):(\d+), gRPC (\S+):(\d+)")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_server_process_serves_and_stops_cleanly(tmp_path: Path, sig: signal.Signals) -> None:
    env = {
        **os.environ,
        "CPN_DATA_DIR": str(tmp_path),
        "CPN_ADMIN_API_KEY": ADMIN_KEY,
        "CPN_ENVIRONMENT": "development",
    }
    env.pop("CPN_DATABASE_URL", None)
    env.pop("CPN_REDIS_URL", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "cpn", "server", "--port", "0", "--grpc-port", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 60
        match = None
        while match is None:
            assert time.monotonic() < deadline, "".join(lines)
            line = proc.stdout.readline()  # type: ignore[union-attr]
            assert line, "server exited before it was up:\n" + "".join(lines)
            lines.append(line)
            match = UP.search(line)
        http_port, grpc_port = int(match.group(2)), int(match.group(4))
        r = httpx.get(f"http://127.0.0.1:{http_port}/healthz", timeout=10)
        assert r.status_code == 200 and r.json()["database"] == "ok"
        r = httpx.get(
            f"http://127.0.0.1:{http_port}/v1/regions", headers={"Authorization": f"Bearer {ADMIN_KEY}"}
        )
        assert r.status_code == 200 and r.json() == []  # the bootstrap admin key works
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=10
            )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING

        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=30)
        lines.append(out)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    log = "".join(lines)
    assert proc.returncode == 0, log
    assert "Traceback" not in log, log
    assert current_revision(f"sqlite:///{tmp_path / 'cpn.sqlite'}") == head_revision()


def test_db_upgrade_command_is_idempotent(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.sqlite'}"
    for _ in range(2):
        result = CliRunner().invoke(app, ["db", "upgrade", "--database-url", url])
        assert result.exit_code == 0, result.output
    assert current_revision(url) == head_revision()
