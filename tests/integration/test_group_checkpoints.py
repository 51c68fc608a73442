"""A replica spanning nodes checkpoints and recovers on the real job path (REST, PostgreSQL + Redis,
`cpn agent` processes, one torchrun group over two of them). Three one-device nodes in three
clusters of a region whose own network is declared private; a two-stage pipeline must span two of
them. Each node holds the whole of every checkpoint in its own work dir (no shared disk). The group's
leader node is killed (kill -9 of its agent and workers) mid-run: the group is re-placed on the
survivor and the third node, which got the checkpoint as a copy or fetches it from the survivor
before it starts, and the job resumes from the newest checkpoint completed before the kill,
losing at most ``checkpoint_every`` steps."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from orchestration.db.models import Task, TaskMetric
from service_layer.cli.local_fleet import LocalAgent, kill_agent, stop_agents
from tests.integration.links import declare_private_region
from tests.integration.test_checkpoint_resume import job_events
from tests.integration.test_end_to_end import (  # noqa: F401 - control_plane is a fixture
    TERMINAL,
    control_plane,
    job_event_kinds,
    launch,
    wait_job,
)

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(420)]

EVERY = 10
STEPS = 200  # the re-placed group must still have steps left when it resumes


def spec() -> dict[str, Any]:
    return {
        "name": "group-ckpt",
        "model": {"family": "gpt", "n_layers": 2, "d_model": 32, "n_heads": 2, "vocab": 32, "seq_len": 32},
        "data": {"kind": "synthetic-markov", "seed": 1},
        "training": {"steps": STEPS, "global_batch_tokens": 4 * 32, "lr": 3e-3, "checkpoint_every": EVERY},
        "parallelism": {"dp": 1, "tp": 1, "pp": 2, "zero": 0},
        "sync": {"mode": "sync", "every": 1},
        "qos": {"max_hours": 1, "objective": "cost"},
    }


def wait_kill_point(client: Any, job_id: str, timeout_s: float) -> dict[str, Any]:
    """Until the group's leader reports a step whose due checkpoint (the latest multiple of
    ``EVERY``, from the second on) it has already reported complete: a kill then loses at most
    ``EVERY`` steps. (A kill while a checkpoint is being written loses also the steps its write
    overlapped: the write runs beside training.)"""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}").raise_for_status().json()
        assert job["status"] not in TERMINAL, f"job ended early: {job['status']} {job['reason']}"
        for t in job["tasks"]:
            m = t["last_metrics"] or {}
            step, done = m.get("step", 0), m.get("checkpoint_step", 0)
            if done >= 2 * EVERY and done == step // EVERY * EVERY:
                return job | {"leader": t}
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} reached no kill point within {timeout_s}s")


def test_a_group_spanning_nodes_resumes_from_its_checkpoint_after_losing_a_node(
    control_plane: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    handle, client = control_plane
    specs = [
        LocalAgent("eu-west", f"paris-{i}", "lumen", price, "EU", devices="cpu:1", measure_profile=False,
                   cross_cluster_host="127.0.0.1")
        for i, price in ((1, 1.0), (2, 1.5), (3, 3.0))
    ]  # fmt: skip
    procs = launch(handle, client, specs, tmp_path)
    declare_private_region(client, "eu-west")
    try:
        job = client.post("/v1/jobs", json={"spec": spec(), "choice": "cheapest"}).raise_for_status().json()
        running = wait_kill_point(client, job["id"], timeout_s=240)
        assert running["option"]["runtime"]["checkpoint_every"] == EVERY
        first = {t["node_id"]: t for t in running["tasks"]}
        with handle.ctx.session_factory() as session:
            groups = [session.get(Task, t["id"]).worker_config.get("group") for t in first.values()]
        assert len(first) == 2 and all(g and g["nnodes"] == 2 for g in groups), groups
        leader = running["leader"]
        (survivor,) = set(first) - {leader["node_id"]}
        # Every node of the group holds the whole checkpoint in its own work dir.
        cluster_of = {t["node_id"]: t["cluster_name"] for t in running["tasks"]}
        for node in first:
            (d,) = tmp_path.glob(f"agent-eu-west-{cluster_of[node]}/checkpoints/{job['id']}/*")
            complete = [p.parent for p in d.glob("step_*/COMPLETE")]
            whole = [(p / ".metadata").is_file() and (p / "meta.pt").is_file() for p in complete]
            # (a step pruned meanwhile is gone as a whole, not half there)
            assert complete and all(w or not p.exists() for w, p in zip(whole, complete, strict=True))
        # Killed at once, in the reaper's grace or not (waiting it out let a fast host finish the
        # job first): the group cannot finish without its leader. The survivor's failure may bring
        # a re-placement before the node is judged lost; the new node then fetches the checkpoint
        # from the survivor, its own group's node, not from the dead one still listed as alive.
        killed_at = client.get(f"/v1/jobs/{job['id']}").raise_for_status().json()
        at_kill = {t["id"]: t for t in killed_at["tasks"]}[leader["id"]]
        kill_agent(procs[[s.cluster for s in specs].index(cluster_of[leader["node_id"]])])
        ckpt_at_kill = at_kill["checkpoint_step"]

        done = wait_job(client, job["id"], TERMINAL, timeout_s=300)
        assert done["status"] == "succeeded", done["reason"]
        assert done["attempt"] > running["attempt"]
        final = {t["node_id"]: t for t in done["tasks"]}
        assert survivor in final and leader["node_id"] not in final and len(final) == 2
        resumed = [r["resumed_from"] for r in done["result"]["per_task"].values() if "resumed_from" in r]
        assert len(resumed) == 1 and resumed[0] is not None, done["result"]["per_task"]
        resumed_from = resumed[0]
        # Not from step 0, not from an older checkpoint than the newest before the kill, and at most
        # one interval of work lost.
        assert resumed_from >= ckpt_at_kill >= 2 * EVERY and resumed_from % EVERY == 0
        # The killed leader's last report, its task's final record: a reading taken just before the
        # kill may lag a checkpoint completed between it and the kill, which is no loss. Nothing it
        # reported complete is lost, nor more than the interval after it, unless the kill landed
        # while the next checkpoint was being written (beside training): that one is lost too.
        with handle.ctx.session_factory() as session:
            last = session.get(Task, leader["id"]).last_metrics or {}
        last_step, last_ckpt = last["step"], last.get("checkpoint_step") or 0
        assert resumed_from >= last_ckpt, (last, resumed_from)
        in_flight = last_step // EVERY * EVERY > last_ckpt
        assert last_step - resumed_from <= (2 * EVERY if in_flight else EVERY), (last, resumed_from)
        # The new node got that checkpoint before it trained: a copy of the leader's ordered while it
        # ran (the group's nodes hold it already, so the region's third node gets it), fetched from
        # the survivor at the re-placement, or, where neither brought that step (a fetch from the
        # dead node, or of a step the survivor had pruned since its last report), sent by the
        # survivor when the group started. (Ranks resume only from a step every rank holds.)
        (new_node,) = set(final) - {survivor}
        arrived = [
            e
            for kind in ("job.checkpoint_copied", "job.checkpoint_fetched")
            for e in job_events(handle, job["id"], kind)
            if e["node_id"] == new_node and e["step"] == resumed_from
        ]
        (new_task,) = [t for t in done["tasks"] if t["node_id"] == new_node]
        run_dir = tmp_path / f"agent-eu-west-{new_task['cluster_name']}" / "assignments" / new_task["id"]
        sent = re.search(
            rf"checkpoint step {resumed_from}: \d+ bytes received from the group",
            (run_dir / "worker.log").read_text(),
        )
        assert arrived or sent, job_event_kinds(handle, job["id"])
        with handle.ctx.session_factory() as session:
            firsts = [
                session.scalar(select(func.min(TaskMetric.step)).where(TaskMetric.task_id == t["id"]))
                for t in done["tasks"]
            ]
        assert min(s for s in firsts if s is not None) > resumed_from, firsts
    finally:
        stop_agents(procs)
