"""Per-stage sync with real workers: two participants in two regions, each one 2-stage pipeline over
two nodes (a torchrun group spanning them), launched by four agents' launchers on loopback. Each
stage's leader meets the same stage of the other participant in a ring of its own and exchanges only
that stage's gradients; together they must train exactly as plain data parallelism over both
replicas in one process."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from agent.settings import AgentSettings
from agent.workers import Assignment, WorkerRun
from contracts.metrics import METRIC_PREFIX, RESULT_PREFIX, parse_lines
from control_layer.planner.plan_types import PlannedTask, PlanOption, SyncTopology
from control_layer.worker_config import (
    TaskSlot,
    build_worker_configs,
    stage_port_counts,
    validate_worker_config,
)
from orchestration.db.models import Cluster, Node
from proto.cpn.agent.v1 import agent_pb2
from tests.orchestration.fleet import hand_option, tiny_spec
from tests.processes import free_ports
from tests.training.harness import load_final_state, reference_run
from training.checkpoint import latest_checkpoint

EU = Cluster(id="ceu", name="eu1", region="eu-west")
US = Cluster(id="cus", name="us1", region="us-east")
STEPS = 6


def two_pipelines(mixed: bool = False) -> tuple[PlanOption, dict[str, list[Node]]]:
    """Replica r's stage s on node (r, s): each replica a pipeline over two nodes of its cluster.
    ``mixed``: the second replica whole on one node instead (its stages on devices 0 and 1)."""
    nodes = {
        EU.id: [Node(id="eu-n0", cluster_id=EU.id), Node(id="eu-n1", cluster_id=EU.id)],
        US.id: [Node(id="us-n0", cluster_id=US.id)] + ([] if mixed else [Node(id="us-n1", cluster_id=US.id)]),
    }
    base = hand_option([(EU, nodes[EU.id][0], 0), (US, nodes[US.id][0], 0)])
    tasks = [
        PlannedTask(dp_rank=r, pp_stage=s, tp_rank=0, cluster=c.id, node=n.id, device=0, region=c.region)
        for r, c in enumerate((EU, US))
        for s, n in enumerate(nodes[c.id] if not (mixed and c is US) else [])
    ]
    if mixed:
        tasks += [
            PlannedTask(
                dp_rank=1, pp_stage=s, tp_rank=0, cluster=US.id, node="us-n0", device=s, region=US.region
            )
            for s in range(2)
        ]
    option = base.model_copy(
        update={
            "dp": 2,
            "pp": 2,
            "n_micro_batches": 2,
            "tasks": tasks,
            "replicas_per_cluster": {EU.id: 1, US.id: 1},
            "sync": SyncTopology(mode="sync", ring=[EU.id, US.id], every=1),
        }
    )
    return option, nodes


def slots(option: PlanOption, nodes: dict[str, list[Node]], stage_ports: bool = True) -> list[TaskSlot]:
    """As allocation makes them: the first node of a group spanning nodes hosts its rendezvous, and
    each node listens once per stage whose leader it holds (the first of them its sync port)."""
    counts = stage_port_counts(option, "sync")
    ports = iter(free_ports(8))
    out = []
    for c in (EU, US):
        group = next(ports) if len(nodes[c.id]) > 1 else None
        for i, n in enumerate(nodes[c.id]):
            own = tuple(next(ports) for _ in range(counts.get(n.id, 0)))
            out.append(
                TaskSlot(
                    node_id=n.id,
                    cluster_id=c.id,
                    cluster_name=c.name,
                    region=c.region,
                    host="127.0.0.1",
                    sync_port=own[0],
                    entries=tuple(e for e in option.tasks if e.node == n.id),
                    group_port=group if i == 0 else None,
                    stage_ports=own if stage_ports else (),
                )
            )
    return out


def test_configs_give_each_stage_its_own_ring() -> None:
    option, nodes = two_pipelines()
    spec = tiny_spec(training={"steps": STEPS, "global_batch_tokens": 128, "lr": 3e-3}, sync={"mode": "sync"})
    placed = slots(option, nodes)
    configs = {
        k: validate_worker_config(v) for k, v in build_worker_configs("job", spec, option, placed).items()
    }
    addr = {s.node_id: f"127.0.0.1:{s.stage_ports[0]}" for s in placed}
    for region, (n0, n1) in (("eu-west", nodes[EU.id]), ("us-east", nodes[US.id])):
        other = "us-east" if region == "eu-west" else "eu-west"
        far = nodes[US.id] if region == "eu-west" else nodes[EU.id]
        for n in (n0, n1):
            stages = configs[n.id]["sync"]["stages"]
            assert [r["stage"] for r in stages] == [0, 1]
            # Stage s's peer is the other pipeline's node holding stage s; a node listens only for
            # the stage whose leader it holds.
            assert [r["peers"] for r in stages] == [{other: addr[far[0].id]}, {other: addr[far[1].id]}]
            assert [r["listen"] for r in stages] == [
                addr[n0.id] if n is n0 else None,
                addr[n1.id] if n is n1 else None,
            ]
            assert all(r["ring_order"] == ["eu-west", "us-east"] for r in stages)
    # Without a port for stage 1's ring on its node the option cannot run.
    with pytest.raises(Exception, match="no sync port for its ring"):
        build_worker_configs("job", spec, option, slots(option, nodes, stage_ports=False))
    # A mode without per-stage rings keeps one leader per participant, gathering the whole replica.
    gossip = tiny_spec(training={"steps": STEPS, "global_batch_tokens": 128}, sync={"mode": "gossip"})
    plain = build_worker_configs("job", gossip, option, placed)
    assert all(not c["sync"].get("stages") for c in plain.values())


def _log_tail(run: WorkerRun, lines: int = 40) -> str:
    log = run.run_dir / "worker.log"
    text = log.read_text() if log.exists() else "(no worker.log)"
    return f"--- {run.run_dir.name}: {run.current.task_status.message}\n" + "\n".join(
        text.splitlines()[-lines:]
    )


def _launch(
    tmp_path: Path, configs: dict[str, dict[str, Any]], devices: dict[str, tuple[int, ...]]
) -> dict[str, list[agent_pb2.AgentMessage]]:
    """Run every node's workers to their end. A node that fails stops the others at once (as the
    control plane cancels a failed job's tasks: a group's other nodes would otherwise wait out its
    rendezvous), and the failure shows every node's log."""
    sent: dict[str, list[agent_pb2.AgentMessage]] = {n: [] for n in configs}

    async def launch() -> list[WorkerRun]:
        runs = []
        for node_id, cfg in configs.items():
            work = tmp_path / cfg["region"]  # both nodes of a pipeline share a disk here (see below)
            settings = AgentSettings(
                server="127.0.0.1:50051", region=cfg["region"], cluster=cfg["cluster"],
                price_per_device_hour=1.0, work_dir=work, metrics_min_interval_s=0.0,
            )  # fmt: skip
            a = Assignment(f"task-{node_id}", "job-st", 1, devices[node_id], len(devices[node_id]), cfg)
            runs.append(
                WorkerRun(
                    a,
                    work / f"run-{node_id}",
                    settings=settings,
                    device_kind="cpu",
                    send=sent[node_id].append,
                )
            )
        tasks = {asyncio.ensure_future(r.run()): r for r in runs}
        pending = set(tasks)
        deadline = asyncio.get_running_loop().time() + 300
        ok = agent_pb2.TASK_STATE_SUCCEEDED
        while pending:
            left = deadline - asyncio.get_running_loop().time()
            done, pending = await asyncio.wait(pending, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            if not done or any(tasks[t].current.task_status.state != ok for t in done):
                for t in pending:
                    await tasks[t].stop("another node of the job failed or the run took too long")
                await asyncio.gather(*pending, return_exceptions=True)
                why = "no node finished within 300 s" if not done else "a node failed"
                pytest.fail(why + "\n" + "\n".join(_log_tail(r) for r in runs))
        for t in tasks:
            t.result()
        return runs

    asyncio.run(launch())
    return sent


def run_job(
    tmp_path: Path, sync: dict[str, Any], per_stage: bool = True, mixed: bool = False
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[int, float]], dict[str, dict[str, torch.Tensor]]]:
    """The two pipelines' configs, every step's loss per participant and their final models.
    ``per_stage=False`` strips the stage rings: each participant's first node gathers its whole
    replica and syncs it in one ring (the path modes without per-stage rings take)."""
    option, nodes = two_pipelines(mixed)
    spec = tiny_spec(training={"steps": STEPS, "global_batch_tokens": 128, "lr": 3e-3}, sync=sync)
    placed = slots(option, nodes)
    configs = build_worker_configs("job-st", spec, option, placed)
    for node_id, cfg in configs.items():
        cfg["metrics_interval_s"] = 0.0  # a metrics line every step, to compare every loss
        # Spanning groups keep no checkpoints (their nodes' disks differ); here both nodes of a
        # pipeline share one work dir on this machine, so its final state can be read back.
        cfg["checkpoint"]["dir"] = "ckpt"
        assert [r["stage"] for r in cfg["sync"]["stages"]] == [0, 1]
        if not per_stage:
            cfg["sync"]["stages"] = []
        configs[node_id] = validate_worker_config(cfg)
    devices = {s.node_id: tuple(s.device_indices) for s in placed}
    sent = _launch(tmp_path, configs, devices)
    losses = {}
    for c in (EU, US):
        lines = [m for m in sent[nodes[c.id][0].id] if m.WhichOneof("kind") == "metrics"]
        losses[c.region] = {m.metrics.step: m.metrics.loss for m in lines}
        assert sorted(losses[c.region]) == list(range(1, STEPS + 1))
        for other in nodes[c.id][1:]:
            assert not [m for m in sent[other.id] if m.WhichOneof("kind") == "metrics"]
    finals = {
        r: load_final_state(tmp_path / r / "ckpt", tmp_path / r)["model"] for r in ("eu-west", "us-east")
    }
    return configs, losses, finals


@pytest.mark.parametrize("mixed", [False, True], ids=["two-pipelines", "beside-a-whole-replica"])
def test_two_pipelines_over_two_nodes_each_sync_per_stage_as_data_parallel(
    tmp_path: Path, mixed: bool
) -> None:
    """mixed: the second participant holds its whole replica on one node, whose two ranks each
    lead a stage's ring on a port of their own."""
    configs, losses, finals = run_job(tmp_path, {"mode": "sync"}, mixed=mixed)
    _, nodes = two_pipelines(mixed)
    ref_cfg = dict(configs[nodes[EU.id][0].id])
    ref_cfg |= {
        "parallel": {"dp_local": 2, "tp": 1, "pp": 1},
        "sync": {"mode": "none", "global_replicas": 2, "replica_offset": 0},
        "group": None,
        "checkpoint": {},
        "training": ref_cfg["training"] | {"micro_batch": None},
    }
    ref_losses, want = reference_run(ref_cfg)
    # Each participant reports its own replica's loss; the reference's is their mean.
    got = [(losses["eu-west"][s] + losses["us-east"][s]) / 2 for s in range(1, STEPS + 1)]
    assert got == pytest.approx(ref_losses, rel=1e-5)
    for name in want:  # both participants hold the same model, and it is the reference's
        assert torch.equal(finals["eu-west"][name], finals["us-east"][name]), name
    got_flat = torch.cat([finals["eu-west"][n].reshape(-1) for n in want])
    ref_flat = torch.cat([w.reshape(-1) for w in want.values()])
    assert float((got_flat - ref_flat).norm() / ref_flat.norm()) < 1e-5
    # Each stage's engine state is checkpointed by stage (the whole replica's node's two leaders).
    meta = torch.load(latest_checkpoint(tmp_path / "us-east" / "ckpt") / "meta.pt", weights_only=False)
    assert sorted(meta["sync"]["stages"]) == [0, 1]
    # The leader reports both rings: every step's metrics merge the two stages' engines, and the run's
    # WAN bytes hold both stages' gradients every step (fp32, pushed to the one peer).
    n_params = ref_flat.numel()
    for c in (EU, US):
        log = (tmp_path / c.region / f"run-{nodes[c.id][0].id}" / "worker.log").read_text()
        out = log.replace("[stdout] ", "")  # the agent tags each line with its stream
        steps = [m for m in parse_lines(out, METRIC_PREFIX) if m.get("sync")]
        assert steps and all(m["sync"]["stages"] == 2 for m in steps)
        (result,) = parse_lines(out, RESULT_PREFIX)
        assert result["wan_bytes_sent"] >= 4 * n_params * STEPS, (result["wan_bytes_sent"], n_params)


def test_diloco_per_stage_matches_diloco_through_one_leader(tmp_path: Path) -> None:
    """DiLoCo's outer step is elementwise, so its stages' rings side by side give the model that one
    leader per participant gathering the whole replica gives (the same runs, bit for bit up to the
    order of float sums)."""
    sync = {"mode": "diloco", "every": 2, "compression": "none"}
    _, staged_losses, staged = run_job(tmp_path / "staged", sync)
    _, plain_losses, plain = run_job(tmp_path / "plain", sync, per_stage=False)
    assert staged_losses["eu-west"] == pytest.approx(plain_losses["eu-west"], rel=1e-6)
    assert staged_losses["us-east"] == pytest.approx(plain_losses["us-east"], rel=1e-6)
    for name, want in plain["eu-west"].items():
        # A stage whose ring did nothing would leave the two participants' halves apart.
        assert torch.equal(staged["eu-west"][name], staged["us-east"][name]), name
        assert torch.allclose(staged["eu-west"][name], want, rtol=1e-5, atol=1e-7), name
