"""A torchrun group spanning two nodes: the control plane's configs, two agents' launchers, one
pipeline whose stages sit on different nodes (loopback stands in for the cluster fabric), in one
cluster or in two clusters of a region whose nodes declared a cross-cluster host."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest

from agent.settings import AgentSettings
from agent.workers import Assignment, WorkerRun, worker_command
from contracts.errors import FailedPrecondition, InvalidArgument
from control_layer.allocation import add_job_credentials
from control_layer.planner.plan_types import PlannedTask, PlanOption
from control_layer.worker_config import TaskSlot, build_worker_configs, validate_worker_config
from orchestration.db.models import Cluster, Node
from orchestration.sync_tls import group_credentials
from proto.cpn.agent.v1 import agent_pb2
from tests.orchestration.fleet import hand_option, tiny_spec
from tests.processes import free_port

CLUSTER = Cluster(id="ceu", name="eu1", region="eu-west")
OTHER = Cluster(id="ceu2", name="eu2", region="eu-west")


def pipeline_option(nodes: list[Node], pp: int, dp: int, micro: int) -> PlanOption:
    """``dp`` replicas whose stage s runs on nodes[s] (device r for replica r), each node in its
    ``cluster_id``."""
    base = hand_option([(CLUSTER, n, 0) for n in nodes])
    tasks = [
        PlannedTask(
            dp_rank=r, pp_stage=s, tp_rank=0, cluster=n.cluster_id, node=n.id, device=r, region=CLUSTER.region
        )
        for s, n in enumerate(nodes)
        for r in range(dp)
    ]
    return base.model_copy(
        update={
            "dp": dp,
            "pp": pp,
            "n_micro_batches": micro,
            "tasks": tasks,
            "replicas_per_cluster": {CLUSTER.id: dp},
        }
    )


def slots_for(
    option: PlanOption, nodes: list[Node], group_port: int, host: str = "127.0.0.1", cross: str | None = None
) -> list[TaskSlot]:
    clusters = {c.id: c for c in (CLUSTER, OTHER)}
    return [
        TaskSlot(
            node_id=n.id,
            cluster_id=n.cluster_id,
            cluster_name=clusters[n.cluster_id].name,
            region=CLUSTER.region,
            host=host,
            sync_port=None,
            entries=tuple(e for e in option.tasks if e.node == n.id),
            group_port=group_port if i == 0 else None,
            cross_cluster_host=cross,
        )
        for i, n in enumerate(nodes)
    ]


@pytest.mark.parametrize(
    ("dp", "across", "later_id_first"), [(1, True, False), (2, False, False), (1, False, True)]
)
def test_a_pipeline_spans_two_nodes_as_one_torchrun_group(
    tmp_path: Path, dp: int, across: bool, later_id_first: bool
) -> None:
    """dp=2: each node holds one stage of both replicas, whose gradients average on that node.
    across: the two nodes are in two clusters and meet at the head's cross-cluster host (their
    cluster address, a TEST-NET one, reaches nothing). later_id_first: the first stage sits on
    the node whose id sorts last, as a searched stage order may put it (``stage_order``): the
    stages, not the ids, give the node ranks."""
    second = OTHER if across else CLUSTER
    nodes = [Node(id="node-a00000", cluster_id=CLUSTER.id), Node(id="node-b00000", cluster_id=second.id)]
    if later_id_first:
        nodes.reverse()
    spec = tiny_spec(training={"steps": 6, "global_batch_tokens": 128, "lr": 3e-3}, sync={"mode": "sync"})
    option = pipeline_option(nodes, pp=2, dp=dp, micro=2)
    port = free_port()
    if across:
        with pytest.raises(FailedPrecondition, match="reachable from other clusters"):
            build_worker_configs("job-pp", spec, option, slots_for(option, nodes, port))
        slots = slots_for(option, nodes, port, host="192.0.2.1", cross="127.0.0.1")
    else:
        slots = slots_for(option, nodes, port)
    configs = build_worker_configs("job-pp", spec, option, slots)
    add_job_credentials(configs, "job-pp", "a-servers-secret")  # as allocation does: TLS rendezvous
    groups = [validate_worker_config(configs[n.id])["group"] for n in nodes]
    assert [(g["nnodes"], g["node_rank"], g["master_addr"], g["master_port"]) for g in groups] == [
        (2, 0, "127.0.0.1", port),
        (2, 1, "127.0.0.1", port),
    ]
    assert groups[0]["store_secret"] == groups[1]["store_secret"]  # one secret per group
    assert {(configs[n.id]["parallel"]["pp"], configs[n.id]["parallel"]["dp_local"]) for n in nodes} == {
        (2, dp)
    }
    sent: dict[str, list[agent_pb2.AgentMessage]] = {n.id: [] for n in nodes}

    async def launch() -> list[WorkerRun]:
        runs = []
        for n in nodes:
            work = tmp_path / n.id
            settings = AgentSettings(
                server="127.0.0.1:50051", region="eu-west", cluster="eu1", price_per_device_hour=1.0,
                work_dir=work, metrics_min_interval_s=0.0,
            )  # fmt: skip
            a = Assignment(f"task-{n.id}", "job-pp", 1, tuple(range(dp)), dp, configs[n.id])
            runs.append(
                WorkerRun(a, work / "run", settings=settings, device_kind="cpu", send=sent[n.id].append)
            )
        await asyncio.wait_for(asyncio.gather(*(r.run() for r in runs)), timeout=240)
        return runs

    runs = asyncio.run(launch())
    for r in runs:
        status = r.current.task_status
        assert status.state == agent_pb2.TASK_STATE_SUCCEEDED, (
            status.message,
            (r.run_dir / "worker.log").read_text(),
        )
    # The leader (node rank 0, stage 0) reports the loss, which only the last stage (on the other
    # node) computes: a finite, falling loss is the pipeline working across the two nodes.
    losses = {m.metrics.step: m.metrics.loss for m in sent[nodes[0].id] if m.WhichOneof("kind") == "metrics"}
    # A job's leader writes at most a line a second (``METRICS_INTERVAL_S``): the first and the last step.
    assert min(losses) == 1 and max(losses) == 6 and set(losses) <= set(range(1, 7)), losses
    assert all(math.isfinite(v) and v > 0 for v in losses.values())
    assert losses[6] < losses[1]
    assert not [m for m in sent[nodes[1].id] if m.WhichOneof("kind") == "metrics"]  # it leads nothing


def test_a_group_command_uses_fixed_node_ranks_and_bad_groups_are_refused(tmp_path: Path) -> None:
    """Across a network, the authenticated rendezvous with the node rank the plan gave; torchrun's
    own static one on loopback only, and only there without the job's credentials."""
    group = {"nnodes": 2, "node_rank": 1, "master_addr": "10.0.0.5", "master_port": 29500}
    secured = group | group_credentials("secret", "j", "n1") | {"store_secret": "ab" * 32}
    cmd = worker_command(
        Assignment("t", "j", 1, (0, 1), 2, {"group": secured}), tmp_path / "c.json", allow_override=False
    )
    i = cmd.index("--nnodes")
    assert cmd[i - 1] == "training.launch" and cmd[i : i + 10] == [
        "--nnodes",
        "2",
        "--rdzv-backend",
        "cpn-tls",
        "--rdzv-endpoint",
        "10.0.0.5:29500",
        "--rdzv-id",
        "j",
        "--rdzv-conf",
        "rank=1",
    ]
    assert "--standalone" not in cmd and not [a for a in cmd if "PRIVATE" in a]  # secrets stay in the file
    local = group | {"master_addr": "127.0.0.1"}
    cmd = worker_command(
        Assignment("t", "j", 1, (0, 1), 2, {"group": local}), tmp_path / "c.json", allow_override=False
    )
    i = cmd.index("--nnodes")
    assert cmd[i - 1] == "training.launch" and cmd[i : i + 4] == ["--nnodes", "2", "--node-rank", "1"]
    solo = worker_command(Assignment("t", "j", 1, (0,), 1, {}), tmp_path / "c.json", allow_override=False)
    assert "--standalone" in solo and "--nnodes" not in solo
    for bad in (
        {**group, "node_rank": 2},
        {**group, "master_port": 0},
        {**group, "nnodes": 1},
        {"nnodes": 2},
        group,  # a rendezvous across a network without the job's credentials
        {**secured, "store_secret": None},
    ):
        with pytest.raises(InvalidArgument, match="worker_config.group"):
            worker_command(
                Assignment("t", "j", 1, (0,), 1, {"group": bad}), tmp_path / "c.json", allow_override=False
            )
