"""A node registers before its reference step and is placed only once its profile lands.

Real parts throughout: `cpn server` as a process on PostgreSQL + Redis (killed and started again
while the node measures), a `cpn agent` process whose reference step is held back the way a
co-located agent's turn holds it (this test holds the host's reference step lock, in a host
temporary directory of the agent's own), then runs for real, and a job's torchrun workers.
"""

from __future__ import annotations

import fcntl
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from agent.profile import HOST_LOCK
from orchestration.bus import RedisBus, default_prefix
from orchestration.db.engine import make_engine, make_session_factory
from orchestration.db.models import Node
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
from tests.integration.test_end_to_end import TERMINAL, wait_job
from tests.integration.test_restart import ServerProcess, server_ports
from tests.resource_layer.harness import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(600)]

HEARTBEAT_S = 1.0
MISSES = 3
# A reference step on a shared 2-core host takes tens of seconds; the waits are ceilings.
MEASURED_WITHIN_S = 300.0


def job_spec() -> dict[str, Any]:
    """Two replicas on the node's two CPU slots: only this node can run it."""
    return {
        "name": "after-measuring",
        "model": {"family": "gpt", "n_layers": 1, "d_model": 32, "n_heads": 2, "vocab": 32, "seq_len": 32},
        "data": {"kind": "synthetic-markov", "seed": 1},
        "training": {"steps": 10, "global_batch_tokens": 2 * 4 * 32, "lr": 3e-3},
        "parallelism": {"dp": 2, "tp": 1, "pp": 1, "zero": 0},
        "qos": {"max_hours": 1, "objective": "cost"},
    }


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
    proc.start()
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
        bus = RedisBus(REDIS_URL, prefix=default_prefix(settings))
        bus.delete_prefixed()
        bus.close()
        drop_postgres_database(url)


def listed(client: httpx.Client) -> dict[str, Any] | None:
    """The one node as ``GET /v1/clusters`` lists it (None before it registered)."""
    nodes = [n for c in client.get("/v1/clusters").raise_for_status().json() for n in c["nodes"]]
    return nodes[0] if nodes else None


def test_a_node_measuring_is_listed_at_once_not_placed_and_runs_the_queued_job_once_ready(
    server: tuple[ServerProcess, httpx.Client, Settings], tmp_path: Path
) -> None:
    proc, client, settings = server
    host_tmp = tmp_path / "host-tmp"  # the agent's host lock and shared figures live here
    host_tmp.mkdir()
    lock = open(host_tmp / HOST_LOCK.name, "a")  # noqa: SIM115 (closed below)
    fcntl.flock(lock, fcntl.LOCK_EX)  # another agent's turn on the host: the reference step waits
    spec = LocalAgent("eu-west", "paris-1", "lumen", 1.0, "EU")
    agents = start_agents(
        [spec], f"127.0.0.1:{proc.grpc_port}", enroll(client, [spec], note="measuring"), tmp_path,
        first_port=32500, env={**os.environ, "TMPDIR": str(host_tmp)},
    )  # fmt: skip
    engine = make_engine(settings.effective_database_url)
    session_factory = make_session_factory(engine)

    def row() -> Node:
        with session_factory() as session:
            node = session.scalars(select(Node)).one()
            session.expunge(node)
            return node

    try:
        # Registered while its reference step waits, heartbeating, and not placeable.
        node = wait_for(
            lambda: (n := listed(client)) and n["status"] == "measuring" and n["alive"] and n,
            timeout=120,
            what="the node listed measuring and alive",
        )
        assert row().measuring and row().profile is None
        quote = client.post("/v1/quotes", json=job_spec())
        assert quote.status_code == 409, quote.text
        assert "1 node(s) are still measuring their profile" in quote.json()["message"]
        job = (
            client.post("/v1/jobs", json={"spec": job_spec(), "choice": "cheapest"}).raise_for_status().json()
        )
        queued = wait_for(
            lambda: (
                "measuring" in ((j := client.get(f"/v1/jobs/{job['id']}").json())["deferred"] or "") and j
            ),
            timeout=60,
            what="the job's reason to wait: the node measuring",
        )
        assert queued["status"] == "queued" and not queued["tasks"]
        assert "waiting for 1 node(s) measuring their profile" in queued["deferred"]

        # A control plane killed and started again while the node measures keeps it measuring,
        # and hears it again.
        proc.kill()
        proc.start()
        wait_for(
            lambda: (n := listed(client)) and n["alive"] and n["heartbeat_age_s"] < 2 * HEARTBEAT_S,
            timeout=60,
            what="the node heard by the restarted control plane",
        )
        assert listed(client)["status"] == "measuring"
        assert client.get(f"/v1/jobs/{job['id']}").json()["status"] == "queued"

        # Its turn: the reference step runs, the profile lands, the node is placed and runs the job.
        fcntl.flock(lock, fcntl.LOCK_UN)
        wait_for_clusters(client, 1, timeout_s=MEASURED_WITHIN_S)
        landed = row()
        assert not landed.measuring and landed.profile is not None and landed.profile["startup_s"] > 0
        done = wait_job(client, job["id"], TERMINAL, timeout_s=300)
        assert done["status"] == "succeeded", done["reason"]
        assert {t["node_id"] for t in done["tasks"]} == {node["id"]}
    finally:
        lock.close()
        stop_agents(agents)
        engine.dispose()
