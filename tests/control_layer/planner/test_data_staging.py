"""Shards and staging in the planner: resident shards' regions each get a replica, regions without
a readable shard are not used, and staging is priced per node from what it fetches (a fetch's
fixed seconds plus its bytes over the rate: learned, else measured by the node's agent, else the
link's guess) and the venv it builds (its CPU seconds at the host share), with egress only for
bytes that cross a region boundary and nothing for what the node's cache holds."""

from __future__ import annotations

import json

import pytest

from contracts.errors import NoFeasiblePlan
from control_layer.planner import (
    Calibration,
    DataStaging,
    JobSpec,
    NodeStaging,
    ResourceSnapshot,
    StagedBlob,
    plan,
)
from control_layer.planner import cost_model as cm
from control_layer.planner.staging import DEFAULT_FETCH_FIXED_S, DEFAULT_VENV_S, shard_for

from .checks import check_option

ART = "artifact:sha256:" + "a" * 64
CODE, SHARD, REQS = ("sha256:" + c * 64 for c in "cde")
NODES = [f"{r}{i}-n" for r in "abc" for i in range(2)]
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


def users_code() -> dict:
    return {"entrypoint": "train:build", "code": {"digest": CODE, "requirements_digest": REQS}}


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
            # Never measured: two fetches at the default fixed seconds, the link's rate.
            expect_s = max(expect_s, 2 * DEFAULT_FETCH_FIXED_S + (code + own) / rate)
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


def test_measured_figures_win_over_the_link_guess_and_learned_ones_over_both(snap) -> None:
    spec = job({"kind": "tokens", "source": ART})
    measured = {n: NodeStaging(fetch_fixed_s=0.2, bytes_per_s=1e6, venv_s=3.0) for n in NODES}
    staging = DataStaging(source=StagedBlob(bytes=10**9), store_region="a", nodes=measured)
    o = plan(spec, snap, staging=staging, max_options=1)[0]
    assert regions_of(o) == {"a"}  # a source restricts no region; the cheap one wins
    reads = o.estimates.staging.reads
    assert {(r.rate_basis, r.fixed_basis, r.fetches) for r in reads} == {("measured", "measured", 1)}
    assert o.estimates.staging_s == pytest.approx(0.2 + 1e9 / 1e6)
    assert o.estimates.cost.staging_egress == 0.0  # the store sits in the nodes' region
    learned = Calibration(
        staging_bytes_per_s=dict.fromkeys(NODES, 2e6), staging_fixed_s=dict.fromkeys(NODES, 0.5)
    )
    o = plan(spec, snap, calibration=learned, staging=staging, max_options=1)[0]
    assert {(r.rate_basis, r.fixed_basis) for r in o.estimates.staging.reads} == {("learned", "learned")}
    assert o.estimates.staging_s == pytest.approx(0.5 + 1e9 / 2e6)


def test_each_fetch_pays_its_fixed_seconds_and_the_venv_its_cpu_seconds(snap) -> None:
    spec = job(shards(b=True, c=True), **users_code())
    measured = {n: NodeStaging(fetch_fixed_s=0.3, bytes_per_s=2e6, venv_s=4.0) for n in NODES}
    staging = DataStaging(
        code=StagedBlob(bytes=10_000, digest=CODE),
        shards={"b": StagedBlob(bytes=2_000_000), "c": StagedBlob(bytes=4_000_000)},
        requirements_digest=REQS,
        nodes=measured,
    )
    options = plan(spec, snap, staging=staging)
    assert options
    for o in options:
        for r in o.estimates.staging.reads:
            own = 2_000_000 if r.region == "b" else 4_000_000
            assert (r.fetches, r.bytes, r.venv_basis) == (2, 10_000 + own, "measured")
            assert r.share == o.estimates.basis.launch_share[r.node]  # one process per node stages
            assert r.venv_s == pytest.approx(4.0 * r.share)
            assert r.seconds == pytest.approx(2 * 0.3 + (10_000 + own) / 2e6 + 4.0 * r.share)
        assert o.estimates.staging_s == pytest.approx(max(r.seconds for r in o.estimates.staging.reads))
    # A node that never measured a venv build is priced at the default.
    bare = staging.model_copy(update={"nodes": {}})
    read = plan(spec, snap, staging=bare, max_options=1)[0].estimates.staging.reads[0]
    assert (read.venv_basis, read.venv_s) == ("default", pytest.approx(DEFAULT_VENV_S * read.share))


def test_what_a_node_holds_costs_no_time_and_no_egress(snap) -> None:
    shard = {"c": {"uri": ART, "resident": False, "sha256": SHARD}}
    spec = job({"kind": "tokens", "shards": shard}, **users_code(), qos={"regions": ["a"]})
    measured = {n: NodeStaging(fetch_fixed_s=0.3, bytes_per_s=2e6, venv_s=4.0) for n in NODES}
    staging = DataStaging(
        code=StagedBlob(bytes=10_000, digest=CODE),
        shards={"c": StagedBlob(bytes=4_000_000, digest=SHARD)},
        store_region="a",
        requirements_digest=REQS,
        nodes=measured,
    )
    cold = plan(spec, snap, staging=staging, max_options=1)[0]
    (node,) = {r.node for r in cold.estimates.staging.reads}
    assert cold.estimates.cost.staging_egress > 0  # c's shard crosses into a
    held = {"cached": {node: [CODE, SHARD]}, "venvs": {node: [REQS]}}
    warm = plan(spec, snap, staging=staging.model_copy(update=held), max_options=1)[0]
    (read,) = warm.estimates.staging.reads
    assert read.node == node and read.cached == ["code", "data.shards.c", "venv"]
    assert (read.fetches, read.bytes, read.venv_s, read.seconds) == (0, 0, 0.0, 0.0)
    assert warm.estimates.staging_s == 0.0 and warm.estimates.cost.staging_egress == 0.0
    # Only the code held: the shard is fetched (and crosses), the venv built.
    half = staging.model_copy(update={"cached": {node: [CODE]}})
    (read,) = plan(spec, snap, staging=half, max_options=1)[0].estimates.staging.reads
    assert read.cached == ["code"] and read.fetches == 1 and read.venv_s > 0
    assert read.seconds == pytest.approx(0.3 + 4_000_000 / 2e6 + read.venv_s)


def test_unknown_size_is_stated_and_priced_as_nothing(snap) -> None:
    spec = job({"kind": "tokens", "source": "file:///data/tokens.bin"})
    o = plan(spec, snap, staging=DataStaging(source=StagedBlob()), max_options=1)[0]
    assert o.estimates.staging_s == 0.0 and o.estimates.staging.unknown == ["data.source"]


def test_staging_counts_against_max_hours(snap) -> None:
    spec = job({"kind": "tokens", "source": ART}, qos={"max_hours": 1})
    slow = DataStaging(source=StagedBlob(bytes=10**9), nodes={n: NodeStaging(bytes_per_s=1e5) for n in NODES})
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


def test_a_venv_build_on_a_shared_host_is_priced_at_the_share_the_plan_leaves_it() -> None:
    # Three agents of one CPU slot each on one 2-core host: their three builds take turns.
    profile = {"startup_s": 1.0, "physical_cores": 2, "rates": {"fp32": {"tflops": 0.05}}}
    device = {"index": 0, "model": "cpu", "memory_gb": 4, "tflops": 0.05}
    node = {"hostname": "h", "profile": profile, "devices": [device]}
    snap = ResourceSnapshot.model_validate(
        {
            "regions": [{"name": "a"}],
            "clusters": [
                {
                    "id": "c",
                    "region": "a",
                    "price_per_device_hour": 1.0,
                    "nodes": [node | {"id": f"n{i}"} for i in range(3)],
                }
            ],
        }
    )
    spec = job(
        **users_code(),
        training={"steps": 50, "global_batch_tokens": 64 * 6},
        parallelism={"dp": 3, "tp": 1, "pp": 1, "zero": 0},
    )
    staging = DataStaging(
        code=StagedBlob(bytes=10_000, digest=CODE),
        requirements_digest=REQS,
        nodes={f"n{i}": NodeStaging(fetch_fixed_s=0.1, bytes_per_s=1e6, venv_s=1.2) for i in range(3)},
    )
    (o,) = plan(spec, snap, staging=staging, max_options=1)
    for r in o.estimates.staging.reads:
        assert r.share == pytest.approx(1.5) == o.estimates.basis.launch_share[r.node]
        assert r.seconds == pytest.approx(0.1 + 10_000 / 1e6 + 1.2 * 1.5)
