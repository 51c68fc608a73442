"""A real job on a real agent: `python -m agent` runs torchrun workers of a bring-your-own job whose
output reaches the control plane over the agent's stream, is stored, and reads back over REST and
through `cpn jobs logs` (following the job to its end)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cpn.cli import app
from service_layer.client import CpnClient
from service_layer.server import ServerHandle, start_server_in_thread
from tests.conftest import settings_for
from tests.service_layer.harness import ADMIN_KEY, small_spec

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(400),
    pytest.mark.parametrize("db_url", ["sqlite"], indirect=True),
]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def server(db_url: str, tmp_path: Path) -> Iterator[ServerHandle]:
    settings = settings_for(
        db_url, data_dir=tmp_path, http_port=0, grpc_port=0, admin_api_key=ADMIN_KEY,
        heartbeat_interval_s=1.0, heartbeat_misses=5,
    )  # fmt: skip
    handle = start_server_in_thread(settings)
    yield handle
    handle.stop()


@pytest.fixture
def agent(server: ServerHandle, admin: CpnClient, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    token = admin.create_token("lumen", note="logs", max_uses=1)["token"]
    work = tmp_path / "agent"
    work.mkdir()
    cmd = [
        sys.executable, "-m", "agent", "--server", server.grpc_target, "--token", token,
        "--region", "eu-west", "--cluster", "paris-1", "--provider", "lumen", "--jurisdiction", "EU",
        "--devices", "cpu:1", "--price-per-device-hour", "1.0", "--sync-ports", "29750-29759",
        "--work-dir", str(work), "--no-measure-profile", "--no-probe-staging",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    with open(work / "agent.log", "wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 60
        while not any(n["alive"] for c in admin.clusters() for n in c["nodes"]):
            assert proc.poll() is None, (work / "agent.log").read_text()
            assert time.monotonic() < deadline, "the agent did not register"
            time.sleep(0.2)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
        sys.stderr.write((work / "agent.log").read_text()[-4000:])


def _cpn(server: ServerHandle, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        app, list(args), env={"CPN_SERVER_URL": server.http_url, "CPN_API_KEY": ADMIN_KEY}
    )
    return result.exit_code, result.output


def test_a_real_workers_output_is_stored_and_followed_to_the_jobs_end(
    server: ServerHandle, admin: CpnClient, agent: Any
) -> None:
    spec = {
        **small_spec("chatty", steps=30),
        "entrypoint": "tests.service_layer.chatty_job:build",
        "parallelism": {"dp": 1, "tp": 1, "pp": 1, "zero": 0},
        "sync": {"mode": "sync"},
    }
    job = admin.submit(spec=spec, choice="cheapest")
    followed: dict[str, Any] = {}

    def follow() -> None:  # from submission on: the CLI prints lines as they come, until the end
        followed["result"] = _cpn(server, "jobs", "logs", job["id"], "-f")

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    deadline = time.monotonic() + 240
    while (status := admin.job(job["id"])["status"]) not in ("succeeded", "failed", "cancelled"):
        assert time.monotonic() < deadline, f"job still {status}"
        time.sleep(0.5)
    done = admin.job(job["id"])
    assert done["status"] == "succeeded", done["reason"]
    task = done["tasks"][0]

    page = admin.logs(job["id"])
    by_stream = {(line["stream"], line["line"]) for line in page["lines"]}
    assert ("stdout", "chatty: building the model on rank 0") in by_stream, page
    assert ("stderr", "chatty: a note on stderr from rank 0") in by_stream, page
    assert all(line["task_id"] == task["id"] and line["region"] == "eu-west" for line in page["lines"])
    assert not any(line["line"].startswith(("CPN_METRIC", "CPN_RESULT")) for line in page["lines"])

    reader.join(30)
    assert not reader.is_alive(), "cpn jobs logs -f did not end with the job"
    code, out = followed["result"]
    assert code == 0, out
    prefix = f"[{task['id'][:8]}/eu-west"
    assert f"{prefix} stdout] chatty: building the model on rank 0" in out
    assert f"{prefix} stderr] chatty: a note on stderr from rank 0" in out
    assert out.rstrip().endswith(f"job {job['id']} succeeded")

    code, out = _cpn(server, "jobs", "logs", job["id"], "--tail", "1", "--task", task["id"][:8])
    assert code == 0 and out.count("\n") == 1 and out.startswith(prefix), out
