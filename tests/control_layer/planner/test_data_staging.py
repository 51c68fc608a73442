"""Shards and staging in the planner: resident shards' regions each get a replica, regions without
a readable shard are not used, and staging is priced from bytes over bandwidth with egress only
for bytes that cross a region boundary."""

from __future__ import annotations

import json

import pytest

from contracts.errors import NoFeasiblePlan
from control_layer.planner import (
    Calibration,
    DataStaging,
    JobSpec,
    ResourceSnapshot,
    StagedBlob,
    plan,
)
from control_layer.planner import cost_model as cm
from control_layer.planner.staging import shard_for

from .checks import check_option

ART = "artifact:sha256:" + "a" * 64
PRICES = {"a": 0.01, "b": 0.05, "c": 0.08}  # "a" is by far the cheapest: a plain plan goes there
EGRESS = {("a", "b"): 0.02, ("a", "c"): 0.05, ("b", "c"): 0.09}
BANDWIDTH = {("a", "b"): 8.0, ("a", "c"): 2.0, ("b", "c"): 4.0}


@pytest.fixture(scope="module")
def snap() -> ResourceSnapshot:
    clusters = [
        {
            "id": f"{r}{i}",
            "region": r,
            "price_per_device_hour": price,
            "nodes": [
                {
                    "id": f"{r}{i}-n",
                    "devices": [
                        {"index": k, "model": "cpu", "memory_gb": 4, "tflops": 0.05} for k in range(2)
                    ],
                }
            ],
        }
        for r, price in PRICES.items()
        for i in range(2)
    ]
    links = [
        {"src": x, "dst": y, "bandwidth_gbps": BANDWIDTH[(x, y)], "latency_ms": 5, "egress_price_per_gb": p}
        for (x, y), p in EGRESS.items()
    ]
    return ResourceSnapshot.model_validate(
        {"regions": [{"name": r} for r in PRICES], "clusters": clusters, "links": links}
    )


def job(data: dict | None = None, **extra) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "shards",
            "model": {"n_layers": 2, "d_model": 64, "n_heads": 4, "vocab": 256, "seq_len": 64},
            "training": {"steps": 50, "global_batch_tokens": 64 * 8},
            "sync": {"mode": "diloco", "every": 10},
            **({"data": data} if data is not None else {}),
            **extra,
        }
    )


def shards(**resident: bool) -> dict:
    return {"kind": "tokens", "shards": {r: {"uri": ART, "resident": res} for r, res in resident.items()}}


def regions_of(option) -> set[str]:
    return {t.region for t in option.tasks}


def test_a_plain_plan_uses_the_cheap_region_only(snap) -> None:
    # The premise of the tests below: without shards nothing draws the job into b or c.
    assert all(regions_of(o) == {"a"} for o in plan(job(), snap))


def test_each_resident_region_gets_a_replica_and_no_other_region_is_used(snap) -> None:
    spec = job(shards(b=True, c=True))
    options = plan(spec, snap)
    assert options
    for o in options:
        check_option(spec, snap, o)
        replicas = {t.region for t in o.tasks if t.pp_stage == 0 and t.tp_rank == 0}
        assert replicas == {"b", "c"}
        check = next(c for c in o.qos_checks if c.name == "resident_shards")
        assert check.ok and "['b', 'c']" in check.detail


def test_a_region_may_read_a_non_resident_shard(snap) -> None:
    spec = job(shards(b=True, c=False))
    options = plan(spec, snap)
    # c's shard may cross: the cheap region "a" is usable again, and b still gets its replica.
    assert any("a" in regions_of(o) for o in options)
    assert all("b" in regions_of(o) for o in options)
    # "a" reads the non-resident shard (the only one it may read); b and c their own.
    assert shard_for(spec, "a", snap) == "c"
    assert shard_for(spec, "b", snap) == "b"


def test_nearest_non_resident_shard_by_bandwidth(snap) -> None:
    spec = job(shards(b=False, c=False))
    assert shard_for(spec, "a", snap) == "b"  # a-b 8 Gb/s beats a-c 2 Gb/s


def test_resident_region_without_devices_is_explained(snap) -> None:
    spec = job(shards(b=True, c=True), qos={"exclude_regions": ["c"]})
    with pytest.raises(NoFeasiblePlan) as got:
        plan(spec, snap)
    assert "['c']" in got.value.message and "resident" in got.value.message
    steps = got.value.details["explanation"]
    assert any(s["constraint"] == "data.shards" for s in steps)


def test_all_resident_shard_in_one_region_plans_there_only(snap) -> None:
    options = plan(job(shards(c=True)), snap)
    assert options and all(regions_of(o) == {"c"} for o in options)


def test_staging_priced_from_bytes_over_bandwidth_and_crossing_egress(snap) -> None:
    spec = job(shards(b=True, c=True))
    code, shard_b, shard_c = 50_000_000, 3_000_000_000, 1_000_000_000
    staging = DataStaging(
        code=StagedBlob(bytes=code),
        shards={"b": StagedBlob(bytes=shard_b), "c": StagedBlob(bytes=shard_c)},
        store_region="b",
    )
    bare = {o.id: o for o in plan(spec, snap)}
    options = plan(spec, snap, staging=staging)
    assert options
    for o in options:
        est = o.estimates
        nodes = {t.node: t.region for t in o.tasks}
        expect_s, expect_usd = 0.0, 0.0
        for region in nodes.values():
            link = snap.link("b", region)
            rate = cm.bytes_per_s(link.bandwidth_gbps, cm.link_goodput("b", region, None))
            own = shard_b if region == "b" else shard_c
            expect_s = max(expect_s, (code + own) / rate)
            # Each node's resident shard stays in its region; only the code crosses, from b to c.
            if region != "b":
                expect_usd += code / cm.GB * EGRESS[("b", "c")]
        assert est.staging_s == pytest.approx(expect_s)
        assert est.cost.staging_egress == pytest.approx(expect_usd) and expect_usd > 0
        assert est.staging.crossing_bytes == code * sum(r != "b" for r in nodes.values())
        assert est.staging.shard_of_region == {"b": "b", "c": "c"}
        assert est.cost.total == pytest.approx(est.cost.devices + est.cost.egress + expect_usd)
        before = bare.get(o.id)
        if before is not None:  # the same placement without staging: staging comes on top
            assert est.duration_s == pytest.approx(before.estimates.duration_s + expect_s)
            assert est.cost.devices > before.estimates.cost.devices


def test_learned_rate_wins_over_the_link_guess(snap) -> None:
    spec = job({"kind": "tokens", "source": ART})
    staging = DataStaging(source=StagedBlob(bytes=10**9), store_region="a", rates={"a0": 1e6, "a1": 1e6})
    o = plan(spec, snap, staging=staging, max_options=1)[0]
    assert regions_of(o) == {"a"}  # a source restricts no region; the cheap one wins
    assert {r.rate_basis for r in o.estimates.staging.reads} == {"learned"}
    assert o.estimates.staging_s == pytest.approx(1e9 / 1e6)
    assert o.estimates.cost.staging_egress == 0.0  # the store sits in the nodes' region


def test_unknown_size_is_stated_and_priced_as_nothing(snap) -> None:
    spec = job({"kind": "tokens", "source": "file:///data/tokens.bin"})
    o = plan(spec, snap, staging=DataStaging(source=StagedBlob()), max_options=1)[0]
    assert o.estimates.staging_s == 0.0 and o.estimates.staging.unknown == ["data.source"]


def test_staging_counts_against_max_hours(snap) -> None:
    spec = job({"kind": "tokens", "source": ART}, qos={"max_hours": 1})
    slow = DataStaging(
        source=StagedBlob(bytes=10**9), rates={f"{r}{i}": 1e5 for r in PRICES for i in range(2)}
    )
    with pytest.raises(NoFeasiblePlan):
        plan(spec, snap, staging=slow)  # 10^4 s of staging on every node


def test_options_without_staging_dump_as_before(snap) -> None:
    for o in plan(job(), snap, calibration=Calibration()):
        text = json.dumps(o.model_dump(mode="json"))
        assert "staging" not in text
        assert o.estimates.staging_s is None and o.estimates.cost.staging_egress is None


def test_a_lost_task_of_a_sharded_job_is_replaced_in_its_own_region_only(snap) -> None:
    from control_layer.planner.replacement import pick_replacement

    args = dict(devices=2, kinds=frozenset({"cpu"}), prefer_region="b")
    # b's nodes are busy (excluded): a job without shards moves to the cheapest other region ...
    busy = frozenset({"b0-n", "b1-n"})
    moved = pick_replacement(job(), snap, exclude_nodes=busy, **args)
    assert moved is not None and moved.region == "a"
    # ... a sharded one stays with its region's shard, or is not replaced.
    sharded = job(shards(b=True, c=False))
    assert pick_replacement(sharded, snap, exclude_nodes=busy, **args) is None
    assert pick_replacement(sharded, snap, exclude_nodes=frozenset({"b0-n"}), **args).node_id == "b1-n"
