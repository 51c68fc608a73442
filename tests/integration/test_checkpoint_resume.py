"""Checkpoints on the real job path: a job submitted over REST checkpoints into its agents' work
dirs, the control plane records each task's latest complete checkpoint, and after a node dies
(kill -9 of its agent and workers) the re-placed job resumes from the checkpoints, never from
step 0: the survivor from its own, the replacement in another region at the same step with the
survivor's model."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from orchestration.db.models import TaskMetric
from service_layer.cli.local_fleet import LocalAgent, kill_agent, stop_agents
from tests.integration.test_end_to_end import (  # noqa: F401 - control_plane is a fixture
    TERMINAL,
    control_plane,
    job_spec,
    launch,
    wait_job,
)

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(420)]

EVERY = 10


def wait_checkpoint(client: Any, job_id: str, min_step: int, timeout_s: float) -> dict[str, Any]:
    """Until every task of the current attempt has reported a complete checkpoint of ``min_step``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}").raise_for_status().json()
        assert job["status"] not in TERMINAL, f"job ended early: {job['status']} {job['reason']}"
        if job["tasks"] and all((t["checkpoint_step"] or 0) >= min_step for t in job["tasks"]):
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not checkpoint step {min_step} within {timeout_s}s")


def test_a_replaced_job_resumes_from_its_checkpoints(control_plane: Any, tmp_path: Path) -> None:  # noqa: F811
    handle, client = control_plane
    specs = [
        LocalAgent("eu-west", "paris-1", "lumen", 1.0, "EU"),
        LocalAgent("eu-north", "stockholm-1", "fjord", 1.5, "EU"),
        LocalAgent("us-east", "virginia-1", "atlas", 3.0, "US"),
    ]
    procs = launch(handle, client, specs, tmp_path)
    by_region = dict(zip([s.region for s in specs], procs, strict=True))
    spec = job_spec(400) | {"sync": {"mode": "diloco", "every": 10}}
    spec["training"] = spec["training"] | {"checkpoint_every": EVERY}
    try:
        job = client.post("/v1/jobs", json={"spec": spec, "choice": "cheapest"}).raise_for_status().json()
        running = wait_checkpoint(client, job["id"], 2 * EVERY, timeout_s=200)
        assert {t["region"] for t in running["tasks"]} == {"eu-west", "eu-north"}
        assert running["option"]["runtime"]["checkpoint_every"] == EVERY
        first = {t["region"]: t for t in running["tasks"]}
        for region in first:  # under each agent's work dir, one directory per participant
            (ckpt_dir,) = tmp_path.glob(f"agent-{region}-*/checkpoints/{job['id']}/{region}")
            assert any(ckpt_dir.glob("step_*/COMPLETE"))
        time.sleep(max(0.0, handle.settings.reaper_grace_s - (time.monotonic() - handle.started_at)))
        kill_agent(by_region["eu-north"])  # the node dies with its workers
        killed = client.get(f"/v1/jobs/{job['id']}").raise_for_status().json()
        at_kill = {t["region"]: (t["last_metrics"] or {}).get("step", 0) for t in killed["tasks"]}

        done = wait_job(client, job["id"], TERMINAL, timeout_s=300)
        assert done["status"] == "succeeded", done["reason"]
        assert done["attempt"] > running["attempt"]
        recorded = done["checkpoints"]
        assert recorded["eu-north"]["node_id"] == first["eu-north"]["node_id"]
        lost_ckpt = recorded["eu-north"]["step"]
        assert lost_ckpt >= 2 * EVERY and lost_ckpt % EVERY == 0
        final = {t["region"]: t for t in done["tasks"]}
        assert set(final) == {"eu-west", "us-east"}
        per_task = done["result"]["per_task"]
        resumed = {per_task[t["id"]]["region"]: per_task[t["id"]]["resumed_from"] for t in done["tasks"]}
        # Nobody restarted from step 0, and no more than one interval of work was lost.
        for step in resumed.values():
            assert step is not None and step >= lost_ckpt, resumed
            assert step % EVERY == 0
        # The lost node was at most one interval past its recorded checkpoint (plus the steps its
        # last reports may lag behind: a report carries the checkpoint of the step before).
        assert 0 <= at_kill["eu-north"] - lost_ckpt <= 2 * EVERY, (at_kill, lost_ckpt)
        with handle.ctx.session_factory() as session:
            firsts = {
                t["region"]: session.scalar(
                    select(TaskMetric.step).where(TaskMetric.task_id == t["id"]).order_by(TaskMetric.step)
                )
                for t in done["tasks"]
            }
        assert all(step > lost_ckpt for step in firsts.values()), firsts
        assert recorded["us-east"]["step"] == 400 and recorded["eu-west"]["step"] == 400
    finally:
        stop_agents(procs)
