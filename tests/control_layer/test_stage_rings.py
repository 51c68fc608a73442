"""Per-stage sync rings in the worker config, and when the control plane asks for them."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.errors import InvalidArgument
from contracts.feasibility import STAGE_SYNC_MODES, syncs_per_stage
from contracts.job_spec import JobSpec
from contracts.worker_config import parse_worker_config
from control_layer.planner.node_groups import node_groups, per_stage_sync, stage_leader_nodes
from control_layer.planner.plan_types import PlannedTask
from control_layer.worker_config import (
    TaskSlot,
    build_worker_configs,
    group_by_node,
    stage_port_counts,
    validate_worker_config,
)
from orchestration.db.models import Cluster, Node
from tests.agent.test_stage_sync_launch import two_pipelines
from tests.control_layer.planner.test_stage_rings_pricing import instance
from tests.orchestration.fleet import hand_option


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


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 1_000_000), mode=st.sampled_from(["sync", "local_sgd", "diloco", "ssp", "gossip"]))
def test_every_stage_ring_is_wired_to_the_nodes_that_lead_it(seed: int, mode: str) -> None:
    """Generated placements (groups split over nodes, whole on one node, or half and half): in the
    dense modes each stage's ring has exactly one listener per participant, on the node holding the
    stage's leader, at a port of that node, and every other participant's config names it as that
    stage's peer; the other modes keep one leader per participant."""
    snap, tasks, groups, pp = instance(random.Random(seed))
    spec = JobSpec.model_validate(
        {
            "name": "st",
            "model": {"n_layers": 4, "d_model": 32, "n_heads": 2, "vocab": 64, "seq_len": 16},
            "training": {"steps": 4, "global_batch_tokens": 16 * 16},
            "sync": {"mode": mode, "every": 2},
        }
    )
    base = hand_option([(Cluster(id=tasks[0].cluster, region=tasks[0].region), Node(id=tasks[0].node), 0)])
    option = base.model_copy(
        update={
            "dp": groups,
            "pp": pp,
            "n_micro_batches": 16 // groups,
            "tasks": tasks,
            "replicas_per_cluster": {c.id: 1 for c in snap.clusters},
            "sync": base.sync.model_copy(update={"mode": mode, "ring": [c.id for c in snap.clusters]}),
        }
    )
    counts = stage_port_counts(option, mode)
    region_of = {c.id: c.region for c in snap.clusters}
    ports = iter(range(9000, 10000))
    heads = {g[0] for g in node_groups(tasks) if len(g) > 1}  # each hosts its group's rendezvous
    slots = []
    for node, entries in group_by_node(option).items():
        own = tuple(next(ports) for _ in range(counts.get(node, 0)))
        slots.append(
            TaskSlot(
                node_id=node,
                cluster_id=entries[0].cluster,
                cluster_name=entries[0].cluster,
                region=region_of[entries[0].cluster],
                host=f"h-{node}",
                sync_port=own[0] if own else next(ports),
                entries=tuple(entries),
                group_port=next(ports) if node in heads else None,
                stage_ports=own,
            )
        )
    configs = {
        n: validate_worker_config(c) for n, c in build_worker_configs("j", spec, option, slots).items()
    }
    if mode not in STAGE_SYNC_MODES:
        assert counts == {} and all(not c["sync"]["stages"] for c in configs.values())
        return
    by_slot = {s.node_id: s for s in slots}
    for stage in range(pp):
        listeners = {}
        for node, cfg in configs.items():
            ring = cfg["sync"]["stages"][stage]
            if ring["listen"]:
                host, port = ring["listen"].rsplit(":", 1)
                assert host == f"h-{node}" and int(port) in by_slot[node].stage_ports
                assert cfg["region"] not in listeners, "two listeners for one participant's stage"
                listeners[cfg["region"]] = ring["listen"]
        assert len(listeners) == groups
        for cfg in configs.values():
            ring = cfg["sync"]["stages"][stage]
            assert ring["peers"] == {k: a for k, a in listeners.items() if k != cfg["region"]}
            assert sorted(ring["ring_order"]) == sorted(listeners)
    for s in slots:  # a node's stage ports are its own and distinct
        assert len(set(s.stage_ports)) == len(s.stage_ports)
