"""A region cut off without a refused connection: its node and workers are frozen (SIGSTOP), so
the peers' sockets stay open and nothing answers, as in a network partition. The control plane
judges the node lost from its missed heartbeats and tells the survivors (PeerLost through their
agents), which stop waiting for it then rather than at the sync timeout."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from contracts.metrics import METRIC_PREFIX
from service_layer.cli.local_fleet import LocalAgent, stop_agents
from tests.integration.test_end_to_end import (  # noqa: F401 - control_plane is a fixture
    TERMINAL,
    control_plane,
    job_event_kinds,
    job_spec,
    launch,
    wait_job,
    wait_training,
)

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(420)]

SYNC_TIMEOUT_S = 30.0  # the worker's default: what each round would wait for the silent peer


def process_tree(root: int) -> list[int]:
    """``root`` and every process descended from it (workers run in sessions of their own)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def survivor_drops(output: str, peer: str) -> list[tuple[int, str]]:
    """(step, why) of each time a worker's metric lines say it dropped ``peer``."""
    out = []
    for line in output.splitlines():
        at = line.find(METRIC_PREFIX)
        if at < 0:
            continue
        m = json.loads(line[at + len(METRIC_PREFIX) :])
        out += [
            (int(m["step"]), e.split(": ", 1)[1])
            for e in (m.get("sync") or {}).get("events", ())
            if e.startswith(f"drop {peer}: ")
        ]
    return out


def wait_step(client: Any, job_id: str, region: str, step: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while step_of(client.get(f"/v1/jobs/{job_id}").raise_for_status().json(), region) < step:
        assert time.monotonic() < deadline, f"{region} did not reach step {step} within {timeout_s}s"
        time.sleep(0.2)


def step_of(job: dict[str, Any], region: str) -> int:
    (task,) = [t for t in job["tasks"] if t["region"] == region]
    return int((task["last_metrics"] or {}).get("step", 0))


def test_a_partitioned_region_is_dropped_at_the_control_planes_word(
    control_plane: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    handle, client = control_plane
    specs = [
        LocalAgent("eu-west", "paris-1", "lumen", 1.0, "EU", measure_profile=False),
        LocalAgent("eu-north", "stockholm-1", "fjord", 1.5, "EU", measure_profile=False),
    ]
    procs = launch(handle, client, specs, tmp_path)
    frozen: list[int] = []
    try:
        job = (
            client.post("/v1/jobs", json={"spec": job_spec(1500), "choice": "cheapest"})
            .raise_for_status()
            .json()
        )
        running = wait_training(client, job["id"], min_step=2, timeout_s=150)
        assert {t["region"] for t in running["tasks"]} == {"eu-west", "eu-north"}
        time.sleep(max(0.0, handle.settings.reaper_grace_s - (time.monotonic() - handle.started_at)))
        frozen = process_tree(procs[1].pid)  # eu-north: its agent and its workers
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        frozen_at = time.monotonic()

        # The survivor is held at its next round for the silent peer until the notice lands: lost
        # after MISSES heartbeats, then the notice's half-second look. It must drop the peer at the
        # control plane's word, not at the sync timeout (a push or contribution timing out first
        # would be the first drop's reason), and train on. Its own metric lines say why it dropped
        # the peer and at which step (its reported step lags by tens of steps under load: no
        # measure of when).
        (survivor,) = [t for t in running["tasks"] if t["region"] == "eu-west"]
        log = tmp_path / "agent-eu-west-paris-1" / "assignments" / survivor["id"] / "worker.log"
        drops: list[tuple[int, str]] = []
        while not drops and time.monotonic() - frozen_at < 3 * SYNC_TIMEOUT_S:
            drops = survivor_drops(log.read_text(errors="replace"), "eu-north")
            time.sleep(0.2)
        assert drops, f"the survivor dropped nobody in {3 * SYNC_TIMEOUT_S:.0f} s"
        dropped_at, why = drops[0]
        assert why.startswith("lost, per the control plane"), drops
        kinds = job_event_kinds(handle, job["id"])
        assert "job.region_lost" in kinds, kinds
        wait_step(client, job["id"], "eu-west", dropped_at + 50, timeout_s=120)  # it trains on
        for pid in frozen:
            os.kill(pid, signal.SIGKILL)
        frozen = []
        done = wait_job(client, job["id"], TERMINAL, timeout_s=300)
        assert done["status"] == "succeeded", done["reason"]
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        stop_agents(procs)
