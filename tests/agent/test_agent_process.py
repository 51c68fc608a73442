"""The agent as it runs on a node: a real ``python -m agent`` process, a real server, real workers.

Workers here are tiny ``python -c`` programs named by the worker config's test-only ``command``
(the agent runs them only with ``--allow-command-override``); the normal path is torchrun over
``training.worker``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from control_layer.dispatch import assignment_message, cancel_message, preempt_message
from orchestration.db.models import Accelerator, Job, Node, Task, TaskMetric
from resource_layer.liveness import node_alive_key
from tests.agent.conftest import Plane, Shared, StartAgent, node_of
from tests.resource_layer.harness import add_task, wait_for

FINISHING = """
import json, os, sys
print("hello from the worker", flush=True)
print("a warning", file=sys.stderr, flush=True)
for step in (1, 2, 3):
    m = {"step": step, "loss": 4.0 - step, "tokens_per_s": 100.0 * step, "compute_util": 0.5,
         "sync": {"bytes_sent": {"us-east": 10}, "bytes_recv": {"us-east": 5}, "latency_s": 0.01}}
    print("CPN_METRIC " + json.dumps(m), flush=True)
print("CPN_RESULT " + json.dumps({"loss_end": 1.0, "omp": os.environ.get("OMP_NUM_THREADS"),
                                  "config": os.environ["CPN_WORKER_CONFIG"]}), flush=True)
"""

# Ignores SIGTERM (so stopping it takes the SIGKILL after the grace period) and has a child.
STUBBORN = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
open("pids", "w").write(f"{os.getpid()} {child.pid}")
print("running", flush=True)
time.sleep(120)
"""


# Stops at its next "step" once the agent creates the preemption file, as training.worker does,
# and says so in its result.
PREEMPTIBLE = """
import json, os, time
cfg = json.load(open(os.environ["CPN_WORKER_CONFIG"]))
step = 0
while not os.path.exists(cfg["preempt_file"]):
    step += 1
    print("CPN_METRIC " + json.dumps({"step": step, "loss": 1.0, "checkpoint_step": step}), flush=True)
    time.sleep(0.05)
print("CPN_RESULT " + json.dumps({"steps": step, "checkpoint_step": step, "preempted": True}), flush=True)
"""


def waiter(go: Path) -> str:
    """Records each start in ./starts, then runs until ``go`` exists."""
    return (
        "import os, time, json\n"
        "open('starts', 'a').write(f'{os.getpid()}\\n')\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.05)\n"
        "print('CPN_RESULT ' + json.dumps({'done': True}), flush=True)\n"
    )


def config(script: str, steps: int = 3) -> dict[str, Any]:
    return {"job_id": "j", "region": "eu-west", "cluster": "paris-1", "training": {"steps": steps},
            "command": [sys.executable, "-c", script]}  # fmt: skip


def dispatch(plane: Plane, node: Node, script: str, device: int = 0) -> str:
    """A task for ``node`` as the control layer dispatches it: a row, then its message on the bus."""
    _, task_id = add_task(
        plane.ctx.session_factory,
        node.id,
        node.cluster_id,
        "eu-west",
        config(script),
        device_indices=[device],
    )
    with plane.ctx.session_factory() as s:
        task = s.get(Task, task_id)
        assert task is not None
        plane.ctx.bus.publish(f"node.{node.id}", assignment_message(task))
    return task_id


def task_row(plane: Plane, task_id: str) -> Task:
    with plane.ctx.session_factory() as s:
        task = s.get(Task, task_id)
        assert task is not None
        return task


def wait_status(plane: Plane, task_id: str, *states: str, timeout: float = 20.0) -> Task:
    return wait_for(
        lambda: (t := task_row(plane, task_id)).status in states and t,
        timeout=timeout,
        what=f"task {task_id} to be {'/'.join(states)}",
    )


def gone(pid: int) -> bool:
    """Exited (a zombie counts: the container's init may be slow to reap reparented children)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except (FileNotFoundError, IndexError):
        return True


def connected(plane: Plane, node_id: str) -> None:
    wait_for(lambda: plane.ctx.bus.alive(node_alive_key(node_id)), timeout=30, what="the agent's stream")


def test_agent_registers_measured_devices_and_heartbeats_keep_it_alive(shared: Shared) -> None:
    plane, node = shared.plane, shared.node
    with plane.ctx.session_factory() as s:
        devices = s.scalars(
            select(Accelerator).where(Accelerator.node_id == node.id).order_by(Accelerator.index)
        ).all()
    assert [(d.index, d.kind, d.model) for d in devices] == [(0, "cpu", "cpu"), (1, "cpu", "cpu")]
    assert all(d.memory_gb > 0 and d.measured_tflops > 0 for d in devices)
    assert (node.advertise_host, node.sync_port_min, node.sync_port_max) == ("127.0.0.1", 29600, 29609)

    key = node_alive_key(node.id)
    ttl = plane.ctx.settings.node_lost_after_s
    first = wait_for(lambda: heartbeat_at(plane, node.id), timeout=30, what="the agent's first heartbeat")
    end = time.monotonic() + 1.5 * ttl  # past one TTL: only fresh heartbeats keep the key
    while time.monotonic() < end:
        assert plane.ctx.bus.alive(key), "the agent's heartbeats stopped keeping its node alive"
        time.sleep(0.1)
    assert heartbeat_at(plane, node.id) > first


def heartbeat_at(plane: Plane, node_id: str) -> Any:
    """The node's last heartbeat time; None until its first (registration sets none)."""
    with plane.ctx.session_factory() as s:
        node = s.get(Node, node_id)
        assert node is not None
        return node.last_heartbeat_at


def test_assignment_runs_a_real_process_and_its_status_metrics_and_result_come_back(shared: Shared) -> None:
    plane, agent, node = shared.plane, shared.agent, shared.node
    task_id = dispatch(plane, node, FINISHING)

    task = wait_status(plane, task_id, "succeeded", "failed")
    assert task.status == "succeeded", task.message
    assert task.exit_code == 0
    assert task.result is not None and task.result["loss_end"] == 1.0
    assert task.result["omp"] == "1"  # CPU slots run one thread each
    run_dir = agent.work_dir / "assignments" / task_id
    assert task.result["config"] == str((run_dir / "worker_config.json").resolve())
    written = json.loads((run_dir / "worker_config.json").read_text())
    assert "command" not in written and written["training"] == {"steps": 3}
    log = (run_dir / "worker.log").read_text()
    assert "[stdout] hello from the worker" in log and "[stderr] a warning" in log

    assert task.last_metrics is not None
    m = task.last_metrics
    assert (m["step"], m["total_steps"], m["loss"]) == (3, 3, 1.0)
    assert (m["wan_bytes_sent"], m["wan_bytes_recv"]) == (30, 15)  # running totals over all steps
    assert m["compute_utilization"] == 0.5 and m["sync_latency_s"] == 0.01
    with plane.ctx.session_factory() as s:
        assert (
            s.scalar(select(func.count()).select_from(TaskMetric).where(TaskMetric.task_id == task_id)) or 0
        ) >= 1
        job = s.get(Job, task.job_id)
        assert job is not None and job.status == "succeeded"


def test_cancel_stops_the_whole_process_group(shared: Shared) -> None:
    plane, agent, node = shared.plane, shared.agent, shared.node
    task_id = dispatch(plane, node, STUBBORN)
    wait_status(plane, task_id, "running")
    pids_file = agent.work_dir / "assignments" / task_id / "pids"
    wait_for(pids_file.exists, what="the worker to start")
    pids = [int(p) for p in pids_file.read_text().split()]
    assert not any(gone(p) for p in pids)

    with plane.ctx.session_factory() as s:
        task = s.get(Task, task_id)
        assert task is not None
        plane.ctx.bus.publish(f"node.{node.id}", cancel_message(task, "cancelled by the test"))
    task = wait_status(plane, task_id, "cancelled", "failed", "succeeded", timeout=20)
    assert task.status == "cancelled" and "cancelled by the test" in task.message
    assert task.exit_code == -9  # it ignored SIGTERM, so the grace period ended in SIGKILL
    wait_for(lambda: all(gone(p) for p in pids), timeout=5, what="the worker and its child to be gone")


def test_agent_reconnects_after_a_server_restart_and_keeps_its_workers(
    plane: Plane, start_agent: StartAgent, tmp_path: Path
) -> None:
    agent = start_agent()
    node = node_of(plane)
    connected(plane, node.id)
    go_early, go_late = tmp_path / "go-early", tmp_path / "go-late"
    early = dispatch(plane, node, waiter(go_early), device=0)
    late = dispatch(plane, node, waiter(go_late), device=1)
    wait_status(plane, early, "running")
    wait_status(plane, late, "running")

    plane.stop_server()
    go_early.touch()  # finishes while the control plane is away: its final state must still arrive
    early_starts = agent.work_dir / "assignments" / early / "starts"
    wait_for(
        lambda: "succeeded" in agent.log() or "SUCCEEDED" in agent.log(), timeout=10, what="early to end"
    )
    time.sleep(1.0)  # the agent fails a few reconnects meanwhile
    assert agent.proc.poll() is None

    plane.start_server_again()
    connected(plane, node.id)
    early_result = wait_status(plane, early, "succeeded").result or {}
    # The worker's result, with the agent's own timings of the task added.
    assert early_result["done"] is True and early_result["task_wall_s"] >= early_result["teardown_s"] >= 0
    assert task_row(plane, late).status == "running"
    go_late.touch()
    assert wait_status(plane, late, "succeeded", "failed").status == "succeeded"
    # Each ran exactly once: the reconnect named them, so nothing was launched again.
    late_starts = agent.work_dir / "assignments" / late / "starts"
    assert len(early_starts.read_text().split()) == 1 and len(late_starts.read_text().split()) == 1
    assert "reconnecting" in agent.log()


def test_restarted_agent_keeps_its_node_and_sigterm_stops_its_workers(
    plane: Plane, start_agent: StartAgent
) -> None:
    first = start_agent()
    node = node_of(plane)
    connected(plane, node.id)
    task_id = dispatch(plane, node, STUBBORN)
    wait_status(plane, task_id, "running")
    pids_file = first.work_dir / "assignments" / task_id / "pids"
    wait_for(pids_file.exists, what="the worker to start")
    pids = [int(p) for p in pids_file.read_text().split()]

    assert first.terminate() == 0
    task = wait_status(plane, task_id, "failed")
    assert "agent is stopping" in task.message
    assert all(gone(p) for p in pids)
    ttl = plane.ctx.settings.node_lost_after_s
    wait_for(
        lambda: not plane.ctx.bus.alive(node_alive_key(node.id)), timeout=3 * ttl, what="liveness to expire"
    )
    state = json.loads((first.work_dir / "agent-state.json").read_text())
    assert state["credentials"]["node_id"] == node.id and state["workers"] == {}
    assert oct(os.stat(first.work_dir / "agent-state.json").st_mode & 0o777) == "0o600"

    second = start_agent(token="")  # no enrollment token: the state file's credentials suffice
    wait_for(lambda: "registered as node" in second.log(), timeout=30, what="re-registration")
    assert f"registered as node {node.id}" in second.log()
    with plane.ctx.session_factory() as s:
        assert s.scalar(select(func.count()).select_from(Node)) == 1


def test_agent_with_a_bad_token_exits_with_the_reason(plane: Plane, start_agent: StartAgent) -> None:
    agent = start_agent(token="cpn_enroll_wrong")
    assert agent.proc.wait(30) == 2
    assert "registration refused (UNAUTHENTICATED)" in agent.log()


@pytest.mark.slow
def _preempt(plane: Plane, node: Node, task_id: str, grace_s: float) -> None:
    with plane.ctx.session_factory() as s:
        task = s.get(Task, task_id)
        assert task is not None
        plane.ctx.bus.publish(f"node.{node.id}", preempt_message(task, "room for another job", grace_s))


def test_preempted_workers_stop_at_their_step_and_the_task_ends_cancelled_with_their_result(
    shared: Shared,
) -> None:
    plane, agent, node = shared.plane, shared.agent, shared.node
    task_id = dispatch(plane, node, PREEMPTIBLE)
    wait_for(lambda: (task_row(plane, task_id).last_metrics or {}).get("step", 0) >= 3, what="a few steps")
    _preempt(plane, node, task_id, grace_s=10)
    task = wait_status(plane, task_id, "cancelled", "failed", "succeeded", timeout=20)
    assert task.status == "cancelled", task.message
    assert "preempted (room for another job)" in task.message and task.exit_code == 0
    assert task.result is not None and task.result["preempted"] is True
    step = task.result["checkpoint_step"]
    assert task.checkpoint_step == step == (task.last_metrics or {}).get("step")
    written = json.loads((agent.work_dir / "assignments" / task_id / "worker_config.json").read_text())
    assert written["preempt_file"] == str(agent.work_dir.resolve() / "assignments" / task_id / "preempt")


def test_workers_that_ignore_a_preemption_are_cancelled_after_its_grace(shared: Shared) -> None:
    plane, agent, node = shared.plane, shared.agent, shared.node
    task_id = dispatch(plane, node, STUBBORN)
    pids_file = agent.work_dir / "assignments" / task_id / "pids"
    wait_for(pids_file.exists, what="the worker to start")
    pids = [int(p) for p in pids_file.read_text().split()]
    started = time.monotonic()
    _preempt(plane, node, task_id, grace_s=1)
    task = wait_status(plane, task_id, "cancelled", "failed", "succeeded", timeout=20)
    assert task.status == "cancelled" and "did not stop within 1s" in task.message, task.message
    assert time.monotonic() - started >= 1  # the grace, then SIGTERM (ignored), then SIGKILL
    assert task.exit_code == -9
    wait_for(lambda: all(gone(p) for p in pids), timeout=5, what="the worker and its child to be gone")


def test_a_preemption_for_an_assignment_the_node_does_not_run_settles_it_cancelled(shared: Shared) -> None:
    plane, node = shared.plane, shared.node
    _, task_id = add_task(plane.ctx.session_factory, node.id, node.cluster_id, "eu-west", config("pass"))
    _preempt(plane, node, task_id, grace_s=5)
    task = wait_status(plane, task_id, "cancelled", "failed", "succeeded", timeout=20)
    assert task.status == "cancelled" and task.message == "not running on this node"


def test_normal_path_runs_torchrun_over_the_training_worker(shared: Shared) -> None:
    """No command override: the agent launches ``torchrun -m training.worker`` on a tiny GPT."""
    plane, node = shared.plane, shared.node
    cfg = {"job_id": "j", "region": "eu-west", "cluster": "paris-1", "device": "cpu",
           "model": {"n_layers": 1, "d_model": 16, "n_heads": 2, "vocab": 16, "seq_len": 8},
           "training": {"steps": 4, "local_batch": 2}}  # fmt: skip
    _, task_id = add_task(
        plane.ctx.session_factory, node.id, node.cluster_id, "eu-west", cfg, device_indices=[1]
    )
    with plane.ctx.session_factory() as s:
        task = s.get(Task, task_id)
        assert task is not None
        plane.ctx.bus.publish(f"node.{node.id}", assignment_message(task))
    task = wait_status(plane, task_id, "succeeded", "failed", timeout=120)
    assert task.status == "succeeded", task.message
    assert task.result is not None and task.result["steps"] == 4
    assert (
        task.last_metrics is not None
        and task.last_metrics["step"] == 4
        and task.last_metrics["total_steps"] == 4
    )
    assert "training.launch --standalone --nproc-per-node 1 -m training.worker" in shared.agent.log()


def test_a_node_declares_its_own_fabric_port_and_the_plane_stores_it(
    plane: Plane, start_agent: StartAgent
) -> None:
    start_agent(node_fabric_gbps="25", node_fabric_latency_ms="0.05", cross_cluster_host="127.0.0.1")
    node = node_of(plane)
    assert (node.fabric_bandwidth_gbps, node.fabric_latency_ms) == (25.0, 0.05)
    assert node.cross_cluster_host == "127.0.0.1"
