"""Pure worker-config building: names, batches, sync settings per mode, refusals."""

from __future__ import annotations

from dataclasses import replace

import pytest

from contracts.errors import FailedPrecondition
from control_layer.planner.plan_types import EstimateInterval, PlanOption
from control_layer.planner.runtime_settings import runtime_settings
from control_layer.worker_config import (
    MIN_TIME_LIMIT_S,
    QUEUE_SLACK_S,
    QUEUE_TOLERANCE,
    TaskSlot,
    build_worker_configs,
    group_by_node,
    job_sync_secret,
    quoted_time_limit_s,
    start_within_s,
    validate_worker_config,
)
from orchestration.db.models import Cluster, Node
from tests.orchestration.fleet import hand_option, tiny_spec


def _fleet() -> tuple[dict[str, Cluster], dict[str, Node]]:
    clusters = {
        "eu": Cluster(id="ceu", name="eu1", region="eu-west"),
        "us": Cluster(id="cus", name="us1", region="us-east"),
        "ap": Cluster(id="cap", name="ap1", region="ap-south"),
    }
    nodes = {k: Node(id=f"n{k}0000000", cluster_id=c.id) for k, c in clusters.items()}
    nodes["eu2"] = Node(id="neu2000000", cluster_id="ceu")
    return clusters, nodes


def _slots(option: PlanOption, clusters: dict[str, Cluster]) -> list[TaskSlot]:
    by_id = {c.id: c for c in clusters.values()}
    return [
        TaskSlot(
            node_id=node_id,
            cluster_id=entries[0].cluster,
            cluster_name=by_id[entries[0].cluster].name,
            region=by_id[entries[0].cluster].region,
            host=f"h-{node_id}",
            sync_port=9000 + i,
            entries=tuple(entries),
        )
        for i, (node_id, entries) in enumerate(sorted(group_by_node(option).items()))
    ]


def test_gossip_mode_gets_the_option_graph_in_participant_names() -> None:
    c, n = _fleet()
    option = hand_option([(c["eu"], n["eu"], 0), (c["us"], n["us"], 0), (c["ap"], n["ap"], 0)])
    option = option.model_copy(update={"sync": option.sync.model_copy(update={
        "mode": "gossip", "gossip": {"ceu": ["cus"], "cus": ["cap"], "cap": ["ceu"]},
    })})  # fmt: skip
    spec = tiny_spec(sync={"mode": "gossip", "every": 1}, training={"steps": 4, "global_batch_tokens": 48})
    configs = build_worker_configs("job", spec, option, _slots(option, c))
    eu = configs[n["eu"].id]
    assert eu["sync"]["gossip_graph"] == [
        {"eu-west": ["us-east"], "us-east": ["ap-south"], "ap-south": ["eu-west"]}
    ]
    assert "outer_lr" not in eu["sync"]  # not DiLoCo and not asked for: the engine's own default
    assert set(eu["sync"]["peers"]) == {"us-east", "ap-south"}
    for cfg in configs.values():
        validate_worker_config(cfg)


def test_explicit_outer_lr_is_passed_for_other_modes() -> None:
    c, n = _fleet()
    option = hand_option([(c["eu"], n["eu"], 0), (c["us"], n["us"], 0)])
    spec = tiny_spec(sync={"mode": "local_sgd", "every": 2, "outer_lr": 0.5})
    configs = build_worker_configs("job", spec, option, _slots(option, c))
    assert {cfg["sync"]["outer_lr"] for cfg in configs.values()} == {0.5}
    assert {"outer_momentum" in cfg["sync"] for cfg in configs.values()} == {False}


def test_two_tasks_in_one_region_get_distinct_names_and_pinned_data_follows() -> None:
    c, n = _fleet()
    option = hand_option([(c["eu"], n["eu"], 0), (c["eu"], n["eu2"], 0)])
    spec = tiny_spec(data={"kind": "synthetic-markov", "region": "eu-west"})
    configs = build_worker_configs("job", spec, option, _slots(option, c))
    names = {cfg["region"] for cfg in configs.values()}
    assert names == {"eu-west/eu1/neu00000", "eu-west/eu1/neu20000"}
    for cfg in configs.values():
        assert cfg["sync"]["region"] == cfg["data"]["region"] == cfg["region"]
        validate_worker_config(cfg)


def test_refusals_name_the_problem() -> None:
    c, n = _fleet()
    option = hand_option([(c["eu"], n["eu"], 0), (c["us"], n["us"], 0)])
    with pytest.raises(
        FailedPrecondition, match="data.region is 'eu-west' but the plan puts a task in 'us-east'"
    ):
        build_worker_configs("job", tiny_spec(data={"region": "eu-west"}), option, _slots(option, c))
    spec = tiny_spec(training={"steps": 4, "global_batch_tokens": 48})  # 3 sequences over 2 replicas
    with pytest.raises(FailedPrecondition, match="3 sequences does not split over 2 replicas"):
        build_worker_configs("job", spec, option, _slots(option, c))
    bad = build_worker_configs("job", tiny_spec(), option, _slots(option, c))[n["eu"].id]
    bad["training"]["micro_batch"] = 3  # does not divide the local batch of 2
    with pytest.raises(FailedPrecondition, match="micro_batch"):
        validate_worker_config(bad)


def test_a_replica_spanning_nodes_of_one_cluster_is_one_group_with_its_rendezvous() -> None:
    c, n = _fleet()
    option = hand_option([(c["eu"], n["eu"], 0), (c["eu"], n["eu2"], 0)], tp=2)
    with pytest.raises(FailedPrecondition, match=r"no port for their rendezvous"):
        build_worker_configs("job", tiny_spec(), option, _slots(option, c))
    slots = [replace(s, group_port=7000) if s.node_id == n["eu"].id else s for s in _slots(option, c)]
    configs = build_worker_configs("job", tiny_spec(), option, slots)
    lead, other = configs[n["eu"].id], configs[n["eu2"].id]
    assert lead["group"] == {
        "nnodes": 2,
        "node_rank": 0,
        "master_addr": f"h-{n['eu'].id}",
        "master_port": 7000,
    }
    assert other["group"] == lead["group"] | {"node_rank": 1}
    # One participant: nobody to sync with, one replica of tp=2 over the two nodes' devices.
    assert lead["sync"]["mode"] == other["sync"]["mode"] == "none"
    assert lead["parallel"] == other["parallel"] and lead["parallel"]["dp_local"] == 1
    # Both nodes checkpoint to the participant's directory (each node ends with the whole of it).
    assert lead["checkpoint"]["dir"] == other["checkpoint"]["dir"] == f"checkpoints/job/{lead['region']}"
    for cfg in configs.values():
        validate_worker_config(cfg)
    # Re-placed after a node of the group died holding step 20, and eu2 holds it too: eu2 resumes
    # from its own copy, eu fetches it from eu2 first; neither gets a start step of its own.
    key = lead["region"]
    held = {
        key: {
            "participant": key,
            "step": 20,
            "node_id": "gone",
            "holders": [{"step": 20, "node_id": n["eu2"].id}],
        }
    }
    configs = build_worker_configs("job", tiny_spec(), option, slots, checkpoints=held)
    lead, other = configs[n["eu"].id]["checkpoint"], configs[n["eu2"].id]["checkpoint"]
    assert lead["fetch"] == {"step": 20, "source_node_id": n["eu2"].id} and other["fetch"] is None
    assert lead["start_step"] is other["start_step"] is None
    # The dead leader's node still listed as holding it (not yet judged lost), and sorting first:
    # eu fetches from eu2, its own group's node, which is placed beside it in this attempt.
    held[key]["holders"].insert(0, {"step": 20, "node_id": "0-dead-leader"})
    configs = build_worker_configs("job", tiny_spec(), option, slots, checkpoints=held)
    assert configs[n["eu"].id]["checkpoint"]["fetch"] == {"step": 20, "source_node_id": n["eu2"].id}
    # The dead leader had completed step 30, but eu2 (its copy of it under way when the leader
    # died) holds 20 at most: the group can only resume at 20, so eu fetches 20 from eu2, not 30.
    held[key]["holders"].append({"step": 30, "node_id": "0-dead-leader"})
    configs = build_worker_configs("job", tiny_spec(), option, slots, checkpoints=held)
    assert configs[n["eu"].id]["checkpoint"]["fetch"] == {"step": 20, "source_node_id": n["eu2"].id}
    assert configs[n["eu2"].id]["checkpoint"]["fetch"] is None


def test_groups_across_clusters_or_with_interleaved_ranks_are_refused() -> None:
    c, n = _fleet()
    across = hand_option([(c["eu"], n["eu"], 0), (c["us"], n["us"], 0)], tp=2)
    with pytest.raises(FailedPrecondition, match=r"across clusters \['ceu', 'cus'\]"):
        build_worker_configs("job", tiny_spec(), across, _slots(across, c))
    # Two replicas of 2 shards, shards 0 on one node and shards 1 on the other: ranks (r0 s0, r0 s1,
    # r1 s0, r1 s1) alternate between the nodes, which torchrun cannot number node by node.
    mixed = hand_option(
        [(c["eu"], n["eu"], 0), (c["eu"], n["eu2"], 0), (c["eu"], n["eu"], 1), (c["eu"], n["eu2"], 1)], tp=2
    )
    with pytest.raises(FailedPrecondition, match=r"contiguous block"):
        build_worker_configs("job", tiny_spec(), mixed, _slots(mixed, c))


def test_byo_entrypoint_gets_no_tensor_parallelism_and_zero_only_when_it_says_so() -> None:
    c, n = _fleet()
    byo = {"entrypoint": "mypkg.train:build"}
    option = hand_option([(c["eu"], n["eu"], 0), (c["eu"], n["eu"], 1)], tp=2)
    with pytest.raises(FailedPrecondition, match="bring-your-own model runs with tp = pp = 1"):
        build_worker_configs("job", tiny_spec(**byo), option, _slots(option, c))
    two = hand_option([(c["eu"], n["eu"], 0), (c["us"], n["us"], 0)])
    sharded = two.model_copy(update={"zero": 2})
    with pytest.raises(FailedPrecondition, match="needs 'zero' in entrypoint_parallelism"):
        build_worker_configs("job", tiny_spec(**byo), sharded, _slots(sharded, c))
    spec = tiny_spec(**byo, entrypoint_parallelism=["dp", "zero"])
    for cfg in build_worker_configs("job", spec, sharded, _slots(sharded, c)).values():
        assert cfg["parallel"]["zero"] == 2 and cfg["data"]["kind"] == "byo"
        validate_worker_config(cfg)


def test_precision_and_checkpointing_reach_the_worker_as_priced() -> None:
    c, n = _fleet()
    option = hand_option([(c["eu"], n["eu"], 0), (c["us"], n["us"], 0)])
    priced = option.model_copy(update={"precision": "bf16", "activation_checkpointing": True})
    spec = tiny_spec(training={"steps": 4, "global_batch_tokens": 64, "activation_checkpointing": True})
    for cfg in build_worker_configs("job", spec, priced, _slots(priced, c)).values():
        parsed = validate_worker_config(cfg)
        assert parsed["training"]["precision"] == "bf16"
        assert parsed["training"]["activation_checkpointing"] is True


def test_the_workers_own_validation_applies_the_shared_rules() -> None:
    c, n = _fleet()
    option = hand_option([(c["eu"], n["eu"], 0), (c["us"], n["us"], 0)])
    cfg = build_worker_configs("job", tiny_spec(), option, _slots(option, c))[n["eu"].id]
    with pytest.raises(FailedPrecondition, match=r"model.n_heads \(2\) must be divisible by tp \(4\)"):
        validate_worker_config({**cfg, "parallel": {**cfg["parallel"], "tp": 4}})
    byo = {**cfg, "entrypoint": "mypkg.train:build", "data": {**cfg["data"], "kind": "byo"}}
    with pytest.raises(FailedPrecondition, match="bring-your-own model runs with tp = pp = 1"):
        validate_worker_config({**byo, "parallel": {**cfg["parallel"], "pp": 2, "microbatches": 2}})


def test_a_jobs_leaders_share_one_sync_secret_that_differs_between_jobs() -> None:
    c, n = _fleet()
    option = hand_option([(c["eu"], n["eu"], 0), (c["us"], n["us"], 0)])
    spec = tiny_spec()
    secrets = []
    for job_id in ("job-a", "job-b"):
        secret = job_sync_secret("server-secret", job_id)
        configs = build_worker_configs(job_id, spec, option, _slots(option, c), sync_secret=secret)
        assert {cfg["sync"]["auth_secret"] for cfg in configs.values()} == {secret}
        for cfg in configs.values():
            validate_worker_config(cfg)
        secrets.append(secret)
    assert secrets[0] != secrets[1] and len(secrets[0]) == 64
    assert job_sync_secret("server-secret", "job-a") == secrets[0]  # stable: a re-placed region rejoins
    assert job_sync_secret("other-server", "job-a") != secrets[0]


def test_configs_carry_the_checkpoint_interval_dir_and_the_modes_overlap() -> None:
    c, n = _fleet()
    option = hand_option([(c["eu"], n["eu"], 0), (c["us"], n["us"], 0)])
    spec = tiny_spec(sync={"mode": "diloco", "every": 4}, training={"steps": 8, "global_batch_tokens": 64})
    configs = build_worker_configs("job1", spec, option, _slots(option, c))
    rt = runtime_settings(spec, option)
    for cfg in configs.values():
        checked = validate_worker_config(cfg)
        assert checked["checkpoint"]["dir"] == f"checkpoints/job1/{cfg['region']}"
        assert checked["checkpoint"]["every"] == rt.checkpoint_every
        assert checked["checkpoint"]["start_step"] is None
        assert checked["sync"]["overlap"] is True and checked["sync"]["fragments"] == rt.fragments
        assert checked["sync"]["overlap_steps"] == rt.overlap_steps
    pinned = tiny_spec(
        sync={"mode": "sync"}, training={"steps": 8, "global_batch_tokens": 64, "checkpoint_every": 3}
    )
    for cfg in build_worker_configs("job1", pinned, option, _slots(option, c)).values():
        assert cfg["checkpoint"]["every"] == 3 and "overlap" not in cfg["sync"]
    solo = hand_option([(c["eu"], n["eu"], 0)])
    (cfg,) = build_worker_configs("job1", spec, solo, _slots(solo, c)).values()
    assert cfg["checkpoint"]["dir"] == "checkpoints/job1/eu-west" and cfg["sync"]["mode"] == "none"


def test_a_task_without_its_checkpoint_starts_at_the_jobs_step_and_one_with_it_resumes() -> None:
    c, n = _fleet()
    option = hand_option([(c["eu"], n["eu"], 0), (c["us"], n["us"], 0), (c["ap"], n["ap"], 0)])
    spec = tiny_spec(training={"steps": 40, "global_batch_tokens": 48})
    records = {
        "eu-west": {"step": 12, "node_id": n["eu"].id},  # same node: its own directory has it
        "us-east": {"step": 12, "node_id": "gone-node"},  # its node is gone
    }
    configs = build_worker_configs("job", spec, option, _slots(option, c), checkpoints=records)
    starts = {cfg["region"]: cfg["checkpoint"]["start_step"] for cfg in configs.values()}
    # ap-south never checkpointed: it begins with the others and takes their model
    assert starts == {"eu-west": None, "us-east": 12, "ap-south": 12}
    for cfg in configs.values():
        validate_worker_config(cfg)
    # alone, a task has nobody to take a model from: it never starts mid-run without its checkpoint
    solo = hand_option([(c["us"], n["us"], 0)])
    (cfg,) = build_worker_configs("job", spec, solo, _slots(solo, c), checkpoints=records).values()
    assert cfg["checkpoint"]["start_step"] is None
    finished = {"eu-west": {"step": 40, "node_id": "x"}}
    configs = build_worker_configs("job", spec, option, _slots(option, c), checkpoints=finished)
    assert {cfg["checkpoint"]["start_step"] for cfg in configs.values()} == {None}


def test_a_synchronous_job_resumes_every_region_at_one_step() -> None:
    c, n = _fleet()
    option = hand_option([(c["eu"], n["eu"], 0), (c["us"], n["us"], 0)])
    option = option.model_copy(update={"sync": option.sync.model_copy(update={"mode": "sync"})})
    spec = tiny_spec(sync={"mode": "sync", "every": 1}, training={"steps": 40, "global_batch_tokens": 64})
    records = {
        "eu-west": {"step": 30, "node_id": n["eu"].id},  # finished a later checkpoint before the pause
        "us-east": {"step": 20, "node_id": "gone-node"},  # its node is gone with step 30's
    }
    configs = build_worker_configs("job", spec, option, _slots(option, c), checkpoints=records)
    for cfg in configs.values():
        assert (cfg["checkpoint"]["resume_at_most"], cfg["checkpoint"]["start_step"]) == (20, 20)
        validate_worker_config(cfg)
    fresh = build_worker_configs("job", spec, option, _slots(option, c))
    assert {cfg["checkpoint"]["resume_at_most"] for cfg in fresh.values()} == {None}


def test_a_task_on_a_node_without_its_checkpoint_fetches_the_newest_copy_it_may_resume_from() -> None:
    c, n = _fleet()
    option = hand_option([(c["eu"], n["eu"], 0), (c["us"], n["us"], 0)])
    option = option.model_copy(update={"sync": option.sync.model_copy(update={"mode": "sync"})})
    spec = tiny_spec(sync={"mode": "sync", "every": 1}, training={"steps": 40, "global_batch_tokens": 64})

    def records(us_step: int) -> dict:
        return {
            # eu-west's own node is gone; copies of steps 10 and 20 live on two other nodes
            "eu-west": {
                "step": 20,
                "node_id": "copy-b",
                "holders": [{"step": 10, "node_id": n["eu2"].id}, {"step": 20, "node_id": "copy-b"}],
            },
            "us-east": {
                "step": us_step,
                "node_id": n["us"].id,
                "holders": [{"step": us_step, "node_id": n["us"].id}],
            },
        }

    configs = build_worker_configs("job", spec, option, _slots(option, c), checkpoints=records(20))
    fetch = {cfg["region"]: cfg["checkpoint"]["fetch"] for cfg in configs.values()}
    assert fetch == {"eu-west": {"step": 20, "source_node_id": "copy-b"}, "us-east": None}
    # Lockstep: a region that only checkpointed step 10 caps everyone at 10, so the copy of 10.
    configs = build_worker_configs("job", spec, option, _slots(option, c), checkpoints=records(10))
    fetch = {cfg["region"]: cfg["checkpoint"]["fetch"] for cfg in configs.values()}
    assert fetch == {"eu-west": {"step": 10, "source_node_id": n["eu2"].id}, "us-east": None}
    # Placed on the node that holds the newest copy: nothing to fetch, it resumes from its own dir.
    on_copy = hand_option([(c["eu"], n["eu2"], 0), (c["us"], n["us"], 0)])
    on_copy = on_copy.model_copy(update={"sync": on_copy.sync.model_copy(update={"mode": "sync"})})
    configs = build_worker_configs("job", spec, on_copy, _slots(on_copy, c), checkpoints=records(10))
    assert {cfg["checkpoint"]["fetch"] is None for cfg in configs.values()} == {True}


def test_dense_modes_get_the_planners_ring_order_in_participant_names() -> None:
    c, n = _fleet()
    option = hand_option([(c["eu"], n["eu"], 0), (c["us"], n["us"], 0), (c["ap"], n["ap"], 0)])
    option = option.model_copy(update={"sync": option.sync.model_copy(update={
        "mode": "diloco", "ring": ["cus", "cap", "ceu"],
    })})  # fmt: skip
    spec = tiny_spec(sync={"mode": "diloco", "every": 2}, training={"steps": 4, "global_batch_tokens": 48})
    configs = build_worker_configs("job", spec, option, _slots(option, c))
    for cfg in configs.values():
        assert cfg["sync"]["ring_order"] == ["us-east", "ap-south", "eu-west"]
        validate_worker_config(cfg)


def test_a_hierarchical_option_gives_every_participant_the_regions_heads_first() -> None:
    c, n = _fleet()
    option = hand_option([(c["eu"], n["eu"], 0), (c["eu"], n["eu2"], 0), (c["us"], n["us"], 0)])
    option = option.model_copy(update={"sync": option.sync.model_copy(update={
        "mode": "sync", "ring": ["cus", "ceu"], "hierarchical": True,
    })})  # fmt: skip
    spec = tiny_spec(sync={"mode": "sync"}, training={"steps": 4, "global_batch_tokens": 48})
    configs = build_worker_configs("job", spec, option, _slots(option, c))
    eu = sorted(cfg["region"] for cfg in configs.values() if cfg["region"].startswith("eu-west"))
    for cfg in configs.values():
        ring = cfg["sync"]["ring_order"]
        assert ring[0] == "us-east" and sorted(ring[1:]) == eu
        # Regions in the ring's order, each region's participants in it: the first is the head.
        assert cfg["sync"]["hierarchy"] == {"us-east": ["us-east"], "eu-west": ring[1:]}
        validate_worker_config(cfg)
    flat = option.model_copy(update={"sync": option.sync.model_copy(update={"hierarchical": False})})
    assert all(
        "hierarchy" not in cfg["sync"]
        for cfg in build_worker_configs("job", spec, flat, _slots(flat, c)).values()
    )


def test_the_quotes_time_limit_reaches_every_task_with_its_margin_and_floor() -> None:
    """A scheduler ends a task at ``time_limit_s`` (Slurm's --time): twice the quote's pessimistic
    run, staging left out (it precedes the launch), never under ten minutes."""
    c, n = _fleet()
    places = [(c["eu"], n["eu"], 0), (c["us"], n["us"], 0)]
    long = hand_option(places, duration_s=4000.0)
    est = long.estimates.model_copy(
        update={
            "staging_s": 500.0,
            "interval": EstimateInterval(
                duration_s_low=3000.0, duration_s_high=5000.0, cost_low=1.0, cost_high=2.0
            ),
        }
    )
    banded = long.model_copy(update={"estimates": est})
    assert quoted_time_limit_s(long) == 8000.0
    assert quoted_time_limit_s(banded) == 9000.0  # 2 x (5000 - 500)
    assert quoted_time_limit_s(hand_option(places, duration_s=60.0)) == MIN_TIME_LIMIT_S
    configs = build_worker_configs("job", tiny_spec(), banded, _slots(banded, c))
    for cfg in configs.values():
        assert validate_worker_config(cfg)["time_limit_s"] == 9000.0
        assert cfg["start_within_s"] == QUEUE_SLACK_S  # no queue quoted: the slack alone
    queued = banded.model_copy(update={"estimates": est.model_copy(update={"queue_wait_s": 200.0})})
    assert start_within_s(queued) == 200.0 * (1 + QUEUE_TOLERANCE) + QUEUE_SLACK_S
    assert quoted_time_limit_s(queued) == 2 * (5000 - 500 - 200)
    with pytest.raises(FailedPrecondition, match="time_limit_s"):
        validate_worker_config({**configs[n["eu"].id], "time_limit_s": float("inf")})
