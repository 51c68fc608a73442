"""An agent ends every process it started, whatever ends it and whenever: SIGTERM or SIGINT during
its start-up measurement, while it waits for another agent's, while torchrun and its ranks run
and while it stops them; SIGKILL while they run.

Each run's processes carry a mark in their environment (``tests.processes``), so a rank that
torchrun started in a session of its own, or one reparented to init, is still found.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from control_layer.dispatch import assignment_message
from orchestration.db.models import Node, Task
from tests.agent.conftest import REPO, AgentProcess, Plane, StartAgent, node_of
from tests.agent.test_agent_process import connected, wait_status
from tests.processes import marked_env, wait_for_process, wait_until_gone
from tests.resource_layer.harness import add_task, wait_for

pytestmark = pytest.mark.slow

# A rank in a long step: silent (a rank that prints meets a closed pipe once its agent is gone,
# and dies of it; one between two prints, or waiting for a peer, does not), with a child of its
# own. It says it is ready in a file once its signals are set: a SIGTERM before that would end it
# by default. A stubborn one ignores SIGTERM (its child inherits that): only the SIGKILL after the grace
# ends them, and it must reach them in the session torchrun started the rank in.
RANK_SCRIPT = """
import os, signal, subprocess, sys, time
if {stubborn}:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
open(f"ready-{{os.getpid()}}", "w").close()
time.sleep(300)
"""
# torchrun starts each rank as `python -u ...`: what tells a rank from torchrun and the keeper,
# whose command lines name the same program.
RANK = "-u "


def agent_env(tmp_path: Path) -> tuple[dict[str, str], str]:
    """A mark for the run's processes; the host's reference step lock in ``tmp_path`` (other runs
    on this host take turns on theirs); the workers import this checkout."""
    return marked_env({**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(REPO)})


def dispatch(plane: Plane, node: Node, worker_config: dict[str, Any], devices: list[int]) -> str:
    _, task_id = add_task(
        plane.ctx.session_factory, node.id, node.cluster_id, "eu-west", worker_config, device_indices=devices
    )
    with plane.ctx.session_factory() as s:
        task = s.get(Task, task_id)
        assert task is not None
        plane.ctx.bus.publish(f"node.{node.id}", assignment_message(task))
    return task_id


def run_torchrun(plane: Plane, node: Node, agent: AgentProcess, tmp_path: Path, *, stubborn: bool) -> str:
    """A task of two torchrun ranks (``RANK_SCRIPT``) on ``node``, once both are ready."""
    rank = tmp_path / "rank.py"
    rank.write_text(RANK_SCRIPT.format(stubborn=stubborn))
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    config = {"job_id": "j", "region": "eu-west", "cluster": "paris-1", "command": [*torchrun, str(rank)]}
    task_id = dispatch(plane, node, config, [0, 1])
    run_dir = agent.work_dir / "assignments" / task_id
    wait_for(lambda: len(list(run_dir.glob("ready-*"))) == 2, timeout=120, what="both ranks to be ready")
    return task_id


def stopped(agent: AgentProcess, sig: signal.Signals) -> int:
    agent.proc.send_signal(sig)
    return agent.proc.wait(90)


def test_a_signal_during_start_up_measurement_ends_it_and_no_reference_step_starts_after_it(
    start_agent: StartAgent, tmp_path: Path
) -> None:
    env_a, mark_a = agent_env(tmp_path)
    env_b, mark_b = agent_env(tmp_path)
    a = start_agent("a", env=env_a, measure=True)
    wait_for_process(mark_a, f"{RANK}-m training.reference_step")  # a's turn: its rank runs
    b = start_agent("b", env=env_b, measure=True)
    wait_for(lambda: "waiting for it" in b.log(), timeout=60, what="b to wait for a's reference step")

    # b, waiting for its turn, is interrupted: it exits, and it never measures, not even once a's
    # turn ends.
    assert stopped(b, signal.SIGINT) == 0, b.log()
    assert wait_until_gone(mark_b) == {}
    assert not (b.work_dir / "reference" / "reference-step.log").exists()

    # a, in the middle of its reference step (registered meanwhile, as "measuring"): the step's
    # whole tree goes, a exits, sending no profile from a step it did not finish.
    assert stopped(a, signal.SIGTERM) == 0, a.log()
    assert wait_until_gone(mark_a) == {}
    assert "worker profile:" not in a.log() and "profile arrived" not in a.log()


def test_sigterm_while_torchrun_runs_and_sigint_while_the_agent_stops_it_leave_nothing(
    plane: Plane, start_agent: StartAgent, tmp_path: Path
) -> None:
    env, mark = agent_env(tmp_path)
    agent = start_agent(env=env)
    node = node_of(plane)
    connected(plane, node.id)
    task_id = run_torchrun(plane, node, agent, tmp_path, stubborn=True)

    agent.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: "agent stopping" in agent.log(), timeout=30, what="the agent to start stopping")
    # The ranks ignore SIGTERM: the agent is stopping them (their grace runs) when SIGINT comes.
    assert stopped(agent, signal.SIGINT) == 0, agent.log()
    assert wait_until_gone(mark) == {}
    task = wait_status(plane, task_id, "failed")
    assert "agent is stopping" in task.message


def test_sigkill_while_torchrun_runs_leaves_nothing(
    plane: Plane, start_agent: StartAgent, tmp_path: Path
) -> None:
    env, mark = agent_env(tmp_path)
    agent = start_agent(env=env)
    node = node_of(plane)
    connected(plane, node.id)
    task_id = run_torchrun(plane, node, agent, tmp_path, stubborn=False)
    wait_status(plane, task_id, "running")

    os.kill(agent.proc.pid, signal.SIGKILL)
    agent.proc.wait(30)
    assert wait_until_gone(mark) == {}
