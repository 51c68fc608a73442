"""Per-stage sync rings in the worker config, and when the control plane asks for them."""

from __future__ import annotations

from typing import Any

import pytest

from contracts.errors import InvalidArgument
from contracts.feasibility import STAGE_SYNC_MODES, syncs_per_stage
from contracts.worker_config import parse_worker_config
from control_layer.planner.node_groups import per_stage_sync, stage_leader_nodes
from control_layer.planner.plan_types import PlannedTask
from control_layer.worker_config import stage_port_counts
from tests.agent.test_stage_sync_launch import two_pipelines


def config(mode: str = "sync", pp: int = 2, **ring: Any) -> dict[str, Any]:
    stages = [
        {"stage": s, "listen": None, "peers": {"us": f"10.0.0.2:{7000 + s}"}, "ring_order": ["eu", "us"]}
        | ring
        for s in range(pp)
    ]
    return {
        "job_id": "j",
        "region": "eu",
        "cluster": "c",
        "model": {"n_layers": 2, "d_model": 32, "n_heads": 4, "vocab": 32, "seq_len": 16},
        "training": {"steps": 2, "global_batch": 8},
        "parallel": {"pp": 2, "microbatches": 2},
        "sync": {
            "mode": mode,
            "region": "eu",
            "peers": {"us": "10.0.0.2:7000"},
            "global_replicas": 2,
            "stages": stages,
        },
    }


def test_a_config_with_a_ring_per_stage_is_accepted() -> None:
    cfg = parse_worker_config(config())
    assert [r.stage for r in cfg.sync.stages] == [0, 1]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (config(mode="gossip"), "per-stage rings run in modes sync, local_sgd, diloco only"),
        (config(pp=1), "must list each of the 2 pipeline stages once"),
        (config(peers={"asia": "10.0.0.3:7000"}), "must name the participants"),
        (config(ring_order=["eu"]), "ring_order"),
    ],
)
def test_a_bad_stage_ring_is_refused_naming_it(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        parse_worker_config(raw)


def test_stages_sync_per_ring_only_where_a_group_splits_its_stage_leaders() -> None:
    option, nodes = two_pipelines()
    assert per_stage_sync(option.tasks, "sync", option.pp)
    assert {n for n, k in stage_port_counts(option, "sync").items() if k == 1} == {
        n.id for ns in nodes.values() for n in ns
    }
    for mode in ("ssp", "async", "gossip"):  # these keep one leader per participant
        assert mode not in STAGE_SYNC_MODES
        assert not per_stage_sync(option.tasks, mode, option.pp)
        assert stage_port_counts(option, mode) == {}
    # One participant alone has nobody to sync with.
    alone = [t for t in option.tasks if t.dp_rank == 0]
    assert not per_stage_sync(alone, "sync", 2)
    assert not syncs_per_stage(mode="sync", participants=2, pp=2, stage_leaders_split=False)


def test_a_whole_replica_on_one_node_beside_a_split_one_leads_both_its_stages() -> None:
    """A mixed job: replica 0's stages on two nodes, replica 1's on one node. Every participant
    syncs per stage (the rings pair stage with stage), so the one-node participant's node leads
    both its stages and needs a port for each."""

    def task(r: int, s: int, node: str, device: int) -> PlannedTask:
        return PlannedTask(
            dp_rank=r, pp_stage=s, tp_rank=0, cluster="c", node=node, device=device, region="eu"
        )

    tasks = [task(0, 0, "a", 0), task(0, 1, "b", 0), task(1, 0, "c", 0), task(1, 1, "c", 1)]
    assert stage_leader_nodes(tasks, {"a", "b"}) == ["a", "b"]
    assert stage_leader_nodes(tasks, {"c"}) == ["c", "c"]
    assert per_stage_sync(tasks, "diloco", 2)
    option, _ = two_pipelines()
    mixed = option.model_copy(update={"tasks": tasks})
    assert stage_port_counts(mixed, "diloco") == {"a": 1, "b": 1, "c": 2}
    # Two whole replicas, each on one node: one leader each, as before.
    whole = [task(0, 0, "a", 0), task(0, 1, "a", 1), task(1, 0, "c", 0), task(1, 1, "c", 1)]
    assert not per_stage_sync(whole, "sync", 2)
