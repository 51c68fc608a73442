"""Two `cpn server` replicas on one PostgreSQL + Redis: the leader is killed outright while a real job
runs across two regions; the agents fail over to the other replica, which takes over the reaper and
the placer, and the job succeeds on its first attempt with nothing duplicated, lost or stuck."""

from __future__ import annotations

import os
import secrets
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from orchestration.bus import RedisBus, default_prefix
from orchestration.db.engine import make_engine, make_session_factory
from orchestration.db.models import Event, LeaderLease, Task, TaskMetric
from orchestration.leadership import SINGLETONS
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
from tests.integration.test_restart import ServerProcess
from tests.processes import free_port

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(480)]

HEARTBEAT_S = 1.0
MISSES = 3
LEASE_S = 3.0
STEPS = 400  # still training when the survivor has taken over


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[tuple[list[ServerProcess], str, Settings]]:
    for reason in (postgres_unreachable(), redis_unreachable()):
        if reason:
            pytest.skip(reason)
    url = create_postgres_database()
    admin_key = "cpn_admin_" + secrets.token_urlsafe(16)
    base = {k: v for k, v in os.environ.items() if not k.startswith("CPN_")}
    base.update(
        CPN_ENVIRONMENT="development", CPN_DATABASE_URL=url, CPN_REDIS_URL=REDIS_URL,
        CPN_DATA_DIR=str(tmp_path), CPN_ADMIN_API_KEY=admin_key, CPN_HEARTBEAT_INTERVAL_S=str(HEARTBEAT_S),
        CPN_HEARTBEAT_MISSES=str(MISSES), CPN_LEADER_LEASE_S=str(LEASE_S), PYTHONUNBUFFERED="1",
    )  # fmt: skip
    settings = Settings(
        database_url=url, redis_url=REDIS_URL, heartbeat_interval_s=HEARTBEAT_S, heartbeat_misses=MISSES
    )
    procs = []
    for name in ("r1", "r2"):
        logs = tmp_path / f"logs-{name}"
        logs.mkdir()
        procs.append(ServerProcess({**base, "CPN_REPLICA_ID": name}, free_port(), free_port(), logs))
    try:
        for p in procs:
            p.start()
        yield procs, admin_key, settings
    finally:
        for p in procs:
            p.stop()
            sys.stderr.write(p.logs()[-6000:])
        bus = RedisBus(REDIS_URL, prefix=default_prefix(settings))
        bus.delete_prefixed()
        bus.close()
        drop_postgres_database(url)


def client_for(proc: ServerProcess, admin_key: str) -> httpx.Client:
    return httpx.Client(
        base_url=f"http://127.0.0.1:{proc.http_port}",
        headers={"Authorization": f"Bearer {admin_key}"},
        timeout=30,
    )


def test_kill_9_of_the_leader_mid_job_loses_nothing(
    replicas: tuple[list[ServerProcess], str, Settings], tmp_path: Path
) -> None:
    procs, admin_key, settings = replicas
    engine = make_engine(settings.effective_database_url)
    session_factory = make_session_factory(engine)

    def holder() -> str:
        with session_factory() as s:
            lease = s.get(LeaderLease, SINGLETONS)
            return lease.holder if lease is not None else ""

    deadline = time.monotonic() + 30
    while holder() not in ("r1", "r2"):
        assert time.monotonic() < deadline, "no replica was elected"
        time.sleep(0.1)
    leader, survivor = (procs[0], procs[1]) if holder() == "r1" else (procs[1], procs[0])
    survivor_id = "r2" if holder() == "r1" else "r1"
    # The takeover is under test, not the price (four replicas fill both clusters whatever they
    # measure): test_job_spans_two_regions_and_succeeds runs the agents' reference measurement.
    specs = [
        LocalAgent("eu-west", "paris-1", "lumen", 1.0, "EU", measure_profile=False),
        LocalAgent("us-east", "virginia-1", "atlas", 2.0, "US", measure_profile=False),
    ]
    # Every replica serves REST: enroll through the standby, submit through the leader.
    standby_client, leader_client = client_for(survivor, admin_key), client_for(leader, admin_key)
    tokens = enroll(standby_client, specs, note="ha")
    # The leader's address first, so the agents' streams are the ones cut by the kill.
    targets = f"127.0.0.1:{leader.grpc_port},127.0.0.1:{survivor.grpc_port}"
    agents = start_agents(specs, targets, tokens, tmp_path, first_port=31700)
    try:
        wait_for_clusters(standby_client, len(specs), timeout_s=90)
        standby_client.put(
            "/v1/links",
            json={"src": "eu-west", "dst": "us-east", "bandwidth_gbps": 1.0, "latency_ms": 40.0,
                  "egress_price_per_gb": 0.02},
        ).raise_for_status()  # fmt: skip
        job_id = (
            leader_client.post("/v1/jobs", json={"spec": job_spec(STEPS), "choice": "cheapest"})
            .raise_for_status()
            .json()["id"]
        )
        running = wait_training(standby_client, job_id, min_step=2, timeout_s=180)
        assert {t["region"] for t in running["tasks"]} == {"eu-west", "us-east"}

        leader.kill()
        killed_at = time.monotonic()
        while holder() != survivor_id:
            assert time.monotonic() - killed_at < 30, "the standby did not take over"
            time.sleep(0.05)
        failover_s = time.monotonic() - killed_at
        back = standby_client.get(f"/v1/jobs/{job_id}").raise_for_status().json()
        assert back["status"] == "running", "the job ended before the takeover: raise STEPS"
        sys.stderr.write(f"failover: the standby led {failover_s:.2f}s after the kill (lease {LEASE_S:g}s)\n")

        done = wait_job(standby_client, job_id, TERMINAL, timeout_s=300)
        assert done["status"] == "succeeded", done["reason"]
        assert done["attempt"] == 1, "the job was re-placed"
        assert all(t["status"] == "succeeded" for t in done["tasks"]), done["tasks"]
        # The new leader places: the next job (the first holds every device until now) runs too.
        second = (
            standby_client.post("/v1/jobs", json={"spec": job_spec(20), "choice": "cheapest"})
            .raise_for_status()
            .json()["id"]
        )
        later = wait_job(standby_client, second, TERMINAL, timeout_s=300)
        assert later["status"] == "succeeded", later["reason"]
        with session_factory() as s:
            kinds = Counter(s.scalars(select(Event.kind)))
            steps = Counter(s.execute(select(TaskMetric.task_id, TaskMetric.step)).all())
            tasks = Counter(s.scalars(select(Task.job_id)))
        assert kinds["task.failed"] == 0 and kinds["node.lost"] == 0, kinds
        assert tasks == {job_id: 2, second: 2}, "a task was created twice"
        assert steps and max(steps.values()) == 1, "a replayed metric was stored twice"
    finally:
        stop_agents(agents)
        standby_client.close()
        leader_client.close()
        engine.dispose()
        for spec in specs:
            log = tmp_path / f"agent-{spec.region}-{spec.cluster}" / "agent.log"
            if log.exists():
                sys.stderr.write(f"--- {log} ---\n{log.read_text(errors='replace')[-3000:]}\n")
