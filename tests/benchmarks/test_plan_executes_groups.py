"""plan_executes checks and launches a group spanning nodes as the agents would: the first node
hosts the rendezvous, every node runs its block of ranks, the group's leader reports."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import plan_executes  # noqa: E402

from control_layer.planner import plan  # noqa: E402
from control_layer.planner.plan_types import PlannedTask  # noqa: E402
from control_layer.planner.snapshot import ClusterInfo, DeviceSlot, NodeInfo, ResourceSnapshot  # noqa: E402
from orchestration.db.models import Cluster, Node  # noqa: E402
from tests.orchestration.fleet import hand_option, tiny_spec  # noqa: E402


def test_a_pipeline_across_two_nodes_is_checked_and_runs(tmp_path: Path) -> None:
    cpu = DeviceSlot(index=0, model="cpu", memory_gb=8.0, tflops=0.1, kind="cpu")
    snap = ResourceSnapshot(
        clusters=[
            ClusterInfo(
                id="c1",
                name="eu1",
                region="eu-west",
                price_per_device_hour=1.0,
                nodes=[NodeInfo(id="na", devices=[cpu]), NodeInfo(id="nb", devices=[cpu])],
            )
        ]
    )
    cluster, nodes = Cluster(id="c1", region="eu-west"), [Node(id="na"), Node(id="nb")]
    base = hand_option([(cluster, n, 0) for n in nodes])
    tasks = [
        PlannedTask(dp_rank=0, pp_stage=s, tp_rank=0, cluster="c1", node=n.id, device=0, region="eu-west")
        for s, n in enumerate(nodes)
    ]
    option = base.model_copy(
        update={"dp": 1, "pp": 2, "n_micro_batches": 2, "tasks": tasks, "replicas_per_cluster": {"c1": 1}}
    )
    spec = tiny_spec(training={"steps": 2, "global_batch_tokens": 64}, sync={"mode": "sync"})
    assert plan_executes.check_option("job", spec, option, snap) is None
    assert plan_executes.group_devices(option) == {"na": 2, "nb": 2}
    assert plan_executes.run_option(plan_executes.Runnable(spec, option, snap), tmp_path, 120) is None


def test_a_pinned_pipeline_on_one_device_nodes_is_planned_across_them_and_runs(tmp_path: Path) -> None:
    """No node holds the pinned 2-stage replica: the planner places it across two nodes, and the
    option runs as the agents would launch it."""
    nodes = [
        NodeInfo(
            id=f"n{i}", devices=[DeviceSlot(index=0, model="cpu", memory_gb=8.0, tflops=0.1, kind="cpu")]
        )
        for i in range(3)
    ]
    snap = ResourceSnapshot(
        clusters=[ClusterInfo(id="c1", name="eu1", region="eu-west", price_per_device_hour=1.0, nodes=nodes)]
    )
    spec = tiny_spec(
        training={"steps": 2, "global_batch_tokens": 64}, parallelism={"dp": 1, "tp": 1, "pp": 2}
    )
    options = plan(spec, snap)
    assert options and all(plan_executes.spans_nodes(o) for o in options)
    o = options[0]
    assert (o.dp, o.tp, o.pp) == (1, 1, 2) and len({t.node for t in o.tasks}) == 2
    assert plan_executes.check_option("job", spec, o, snap) is None
    assert plan_executes.run_option(plan_executes.Runnable(spec, o, snap), tmp_path, 120) is None


def test_two_pinned_pipelines_on_one_device_nodes_sync_per_stage_and_run(tmp_path: Path) -> None:
    """Two 2-stage replicas, no node holding one: the planner places each across two nodes, the two
    groups sync stage by stage (a ring per stage, each stage's leader on its own node, with a port
    of its own), and the option runs as the agents would launch it."""
    from control_layer.planner.node_groups import node_groups, per_stage_sync

    nodes = [
        NodeInfo(
            id=f"n{i}", devices=[DeviceSlot(index=0, model="cpu", memory_gb=8.0, tflops=0.1, kind="cpu")]
        )
        for i in range(4)
    ]
    snap = ResourceSnapshot(
        clusters=[ClusterInfo(id="c1", name="eu1", region="eu-west", price_per_device_hour=1.0, nodes=nodes)]
    )
    spec = tiny_spec(
        training={"steps": 2, "global_batch_tokens": 128},
        parallelism={"dp": 2, "tp": 1, "pp": 2},
        sync={"mode": "sync"},
    )
    options = plan(spec, snap)
    assert options
    o = options[0]
    assert len(node_groups(o.tasks)) == 2 and per_stage_sync(o.tasks, "sync", o.pp)
    assert plan_executes.check_option("job", spec, o, snap) is None
    assert plan_executes.run_option(plan_executes.Runnable(spec, o, snap), tmp_path, 180) is None


def test_a_pipeline_across_regions_is_checked_as_the_agents_would_launch_it() -> None:
    """Two A10 nodes per region, all declared reachable across clusters: every option runs one
    pipeline through both regions, and its worker configs pass the worker's own checks (the group
    meets at its head's declared host)."""
    from control_layer.planner.search import with_precision
    from tests.control_layer.planner.test_cross_region_pipelines import BIG, _big

    snap = _big([("a", "eu", 2, 2, 1.0), ("b", "us", 2, 2, 1.0)])
    options = plan(BIG, snap)
    assert options
    for o in options:
        assert {t.region for t in o.tasks} == {"eu", "us"}
        assert plan_executes.check_option("job", with_precision(BIG, o.precision), o, snap) is None
