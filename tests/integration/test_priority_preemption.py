"""Priority preemption as a user meets it (REST, PostgreSQL + Redis, a `cpn agent` process with two
CPU slots, torchrun workers): a higher-priority job submitted to a full fleet is answered `queued`;
the placer has the running lower-priority preemptible job checkpoint and requeue, places the
higher-priority job on the freed devices, then the preempted job again, which resumes from its
checkpoint. A lower-priority job that does not allow preemption is left running, and the
higher-priority job waits with a reason saying so. The ledger charges both runs of the preempted job."""

from __future__ import annotations

import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from orchestration.db.models import Event, LedgerPosting, Task
from service_layer.cli.local_fleet import LocalAgent, stop_agents
from tests.integration.test_end_to_end import (  # noqa: F401 - control_plane is a fixture
    TERMINAL,
    control_plane,
    job_spec,
    launch,
    wait_job,
    wait_training,
)
from tests.integration.test_preemption import STEPS, device_hours, one_cluster_spec, wait_event

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(600)]

HIGH_STEPS = 40


def high_spec() -> dict[str, Any]:
    """Both slots of the one node, priority 10, a few steps."""
    spec = job_spec(HIGH_STEPS) | {"name": "urgent", "parallelism": {"dp": 2, "tp": 1, "pp": 1, "zero": 0}}
    spec["training"] = spec["training"] | {"global_batch_tokens": 2 * 4 * 32}
    spec["qos"] = spec["qos"] | {"priority": 10}
    return spec


def low_spec(*, preemptible: bool) -> dict[str, Any]:
    spec = one_cluster_spec(preemptible=preemptible)
    spec["qos"] = spec["qos"] | {"priority": 0}
    return spec


def submit_queued(client: Any, spec: dict[str, Any]) -> dict[str, Any]:
    answer = client.post("/v1/jobs", json={"spec": spec})
    assert answer.status_code == 201, answer.text
    job = answer.json()
    assert job["status"] == "queued" and job["queue"]["position"] >= 1, job
    return job


def wait_reason(client: Any, job_id: str, needle: str, timeout_s: float) -> dict[str, Any]:
    """Until the queued job's reason contains ``needle`` (the placer's pass has seen it)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}").raise_for_status().json()
        assert job["status"] == "queued", job
        if needle in ((job["queue"] or {}).get("reason") or ""):
            return job
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} still queued without {needle!r}: {job['queue']}")


def placed_event_ids(handle: Any, job_id: str) -> list[int]:
    with handle.ctx.session_factory() as session:
        return list(
            session.scalars(
                select(Event.id).where(Event.job_id == job_id, Event.kind == "job.placed").order_by(Event.id)
            )
        )


def test_a_higher_priority_job_preempts_a_preemptible_one_and_both_succeed(
    control_plane: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    handle, client = control_plane
    procs = launch(
        handle,
        client,
        [LocalAgent("eu-west", "paris-1", "lumen", 2.0, "EU", measure_profile=False)],
        tmp_path,
    )
    try:
        # A lower-priority job that does not allow preemption keeps its devices: the urgent job waits.
        fixed = submit_queued(client, low_spec(preemptible=False))
        wait_training(client, fixed["id"], min_step=5, timeout_s=200)
        urgent = submit_queued(client, high_spec())
        waiting = wait_reason(client, urgent["id"], "qos.preemptible", timeout_s=60)
        assert waiting["queue"]["reason"].startswith("waiting for devices"), waiting["queue"]
        still = client.get(f"/v1/jobs/{fixed['id']}").raise_for_status().json()
        assert still["status"] == "running" and still["preemption"] is None, still
        for job in (urgent, fixed):
            client.post(f"/v1/jobs/{job['id']}/cancel", json={"reason": "next case"}).raise_for_status()
        wait_job(client, fixed["id"], TERMINAL, timeout_s=60)

        # A preemptible one fills the fleet and trains past its first steps.
        low = submit_queued(client, low_spec(preemptible=True))
        running = wait_training(client, low["id"], min_step=30, timeout_s=200)
        (first,) = running["tasks"]

        high = submit_queued(client, high_spec())
        preempted = wait_event(handle, low["id"], "job.preempted", timeout_s=120)
        assert preempted["by_job_id"] == high["id"], preempted
        stopped = preempted["tasks"][first["id"]]
        checkpoint = stopped["checkpoint_step"]
        assert checkpoint is not None and 30 <= checkpoint < STEPS, stopped

        done_high = wait_job(client, high["id"], TERMINAL, timeout_s=300)
        assert done_high["status"] == "succeeded", done_high["reason"]
        (high_task,) = done_high["tasks"]
        assert (high_task["node_id"], sorted(high_task["device_indices"])) == (
            first["node_id"],
            sorted(first["device_indices"]),
        )  # the devices the preempted job freed

        done_low = wait_job(client, low["id"], TERMINAL, timeout_s=300)
        assert done_low["status"] == "succeeded", done_low["reason"]
        assert (done_low["attempt"], done_low["preemptions"]) == (2, 1)
        (second,) = done_low["tasks"]
        assert done_low["result"]["per_task"][second["id"]]["resumed_from"] == checkpoint
        # Placed again only after the urgent job: it did not take back the devices it freed.
        (high_placed,) = placed_event_ids(handle, high["id"])
        low_placed = placed_event_ids(handle, low["id"])
        assert len(low_placed) == 2 and low_placed[0] < high_placed < low_placed[1], (low_placed, high_placed)

        # The ledger charges the device time of both runs; every transaction balances.
        txs = client.get("/v1/ledger/transactions", params={"job_id": low["id"], "limit": 1000})
        gpu = [tx for tx in txs.raise_for_status().json()["transactions"] if tx["kind"] == "gpu"]
        assert {tx["task_id"] for tx in gpu} == {first["id"], second["id"]}
        for tx in gpu:
            assert sum(Decimal(p["amount"]) for p in tx["postings"]) == 0
        with handle.ctx.session_factory() as session:
            tasks = session.scalars(select(Task).where(Task.job_id == low["id"])).all()
            balance = session.scalar(select(func.coalesce(func.sum(LedgerPosting.amount_micros), 0)))
        assert sum(tx["quantity"] for tx in gpu) == pytest.approx(sum(device_hours(t) for t in tasks))
        assert balance == 0
    finally:
        stop_agents(procs)
