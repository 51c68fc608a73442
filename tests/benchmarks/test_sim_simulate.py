"""simulate() on hand-built plans: closed forms where one exists, monotonicity where not."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.sim import simulate
from benchmarks.sim.workload import workload
from contracts.job_spec import JobSpec
from contracts.model import gpt_param_count, model_config
from control_layer.planner.plan_types import PlanOption, RuntimeSettings
from control_layer.planner.snapshot import ResourceSnapshot

GBPS = 1e9 / 8


def _spec(
    layers: int = 4, d: int = 256, vocab: int = 1000, seq: int = 128, batch_seqs: int = 8, **kw
) -> JobSpec:
    training = {"steps": 100, "global_batch_tokens": seq * batch_seqs, **kw.pop("training", {})}
    # The options here are built by hand, not planned: every sync setting concrete.
    kw["sync"] = {"every": 100, "compression": "none", **kw.get("sync", {})}
    return JobSpec.model_validate(
        {
            "name": "t",
            "model": {"n_layers": layers, "d_model": d, "n_heads": 4, "vocab": vocab, "seq_len": seq},
            "training": training,
            **kw,
        }
    )


def _snapshot(clusters: list[tuple[str, str, int, int, float]], tflops: float = 100.0, wan: float = 10.0):
    """clusters: (id, region, nodes, devices per node, fabric Gbps)."""
    regions = sorted({r for _, r, _, _, _ in clusters})
    return ResourceSnapshot.model_validate(
        {
            "regions": [{"name": r} for r in regions],
            "clusters": [
                {
                    "id": cid,
                    "region": reg,
                    "intra_bandwidth_gbps": fabric,
                    "intra_latency_ms": 0.01,
                    "price_per_device_hour": 1.0,
                    "nodes": [
                        {
                            "id": f"{cid}-n{j}",
                            "devices": [
                                {"index": k, "model": "G", "memory_gb": 80, "tflops": tflops}
                                for k in range(per)
                            ],
                        }
                        for j in range(nodes)
                    ],
                }
                for cid, reg, nodes, per, fabric in clusters
            ],
            "links": [
                {"src": a, "dst": b, "bandwidth_gbps": wan, "latency_ms": 50.0}
                for a, b in itertools.combinations(regions, 2)
            ],
        }
    )


def _option(spec: JobSpec, snap: ResourceSnapshot, dp: int, tp: int, pp: int, **kw) -> PlanOption:
    """Replica-major, then stage, then tp rank, over the snapshot's devices in order."""
    devices = [(c.id, n.id, d.index, c.region) for c in snap.clusters for n in c.nodes for d in n.devices]
    tasks = []
    for i, (r, s, t) in enumerate(itertools.product(range(dp), range(pp), range(tp))):
        c, n, d, reg = devices[i]
        tasks.append(
            {"dp_rank": r, "pp_stage": s, "tp_rank": t, "cluster": c, "node": n, "device": d, "region": reg}
        )
    b = spec.training.micro_batch_size
    per_cluster: dict[str, int] = {}
    for t in tasks:
        if t["pp_stage"] == 0 and t["tp_rank"] == 0:
            per_cluster[t["cluster"]] = per_cluster.get(t["cluster"], 0) + 1
    return PlanOption.model_validate(
        {
            "id": "x",
            "dp": dp,
            "tp": tp,
            "pp": pp,
            "zero": kw.get("zero", 0),
            "pp_schedule": kw.get("schedule", "1f1b"),
            "micro_batch_size": b,
            "n_micro_batches": spec.global_batch_sequences // (dp * b),
            "replicas_per_cluster": per_cluster,
            "tasks": tasks,
            "sync": {
                "mode": spec.sync.mode,
                "every": spec.sync.every,
                "ring": sorted(per_cluster),
                "compression": spec.sync.compression,
            },
            "estimates": {
                "step_s": {"compute": 0.0},
                "steps": spec.training.steps,
                "duration_s": 0.0,
                "cost": {"devices": 0.0},
                "memory_per_device_gb": 0.0,
                "tokens_per_s": 0.0,
                "wan_bytes_per_step": 0.0,
            },
        }
    )


def _fwd_flops_per_seq(L: int, d: int, s: int, v: int) -> float:
    # per sequence: blocks 2·(4d² + 8d²) + attention 4·s·d per token, head 2·d·V per token
    return s * (L * (2 * 12 * d * d + 4 * s * d) + 2 * d * v)


@pytest.mark.parametrize("ckpt", [False, True])
def test_single_device_iteration_is_micro_batches_times_forward_plus_backward(ckpt: bool) -> None:
    spec = _spec(training={"activation_checkpointing": ckpt})
    snap = _snapshot([("c", "r", 1, 1, 100.0)])
    res = simulate(spec, _option(spec, snap, 1, 1, 1), snap, efficiency=0.5)
    fwd = _fwd_flops_per_seq(4, 256, 128, 1000) / (100e12 * 0.5)
    recompute = 128 * 4 * (2 * 12 * 256 * 256 + 4 * 128 * 256) / (100e12 * 0.5) if ckpt else 0.0
    expected = 8 * (fwd + 2 * fwd + recompute)
    assert res.iteration_s == pytest.approx(expected, rel=1e-12)
    assert res.compute_s == pytest.approx(expected, rel=1e-12)
    assert res.step_s == res.iteration_s
    assert res.bubble_s == res.pp_comm_s == res.dp_sync_s == res.tp_comm_s == res.wan_sync_s == 0.0


@pytest.mark.parametrize(
    ("layers", "d", "vocab", "seq"), [(4, 256, 1000, 128), (7, 96, 50304, 64), (2, 64, 2, 8)]
)
def test_the_workload_counts_the_model_the_worker_builds(layers: int, d: int, vocab: int, seq: int) -> None:
    spec = _spec(layers=layers, d=d, vocab=vocab, seq=seq)
    for pp, tp in [(1, 1), (2, 1), (1, 2)]:
        w = workload(spec, pp, tp, 1)
        assert w.n_params == gpt_param_count(model_config(spec.model))
    w1 = workload(spec, 1, 1, 1)
    assert sum(st.grad_bytes for st in w1.stages) == 4 * w1.n_params  # fp32 gradients


def test_two_replicas_on_one_node_add_one_ring_all_reduce_of_the_gradients() -> None:
    spec = _spec()
    snap = _snapshot([("c", "r", 1, 2, 100.0)])
    two = simulate(spec, _option(spec, snap, 2, 1, 1), snap)
    grads = 4.0 * workload(spec, 1, 1, 1).n_params
    ring = 2 * (2 - 1) * (grads / 2 / (100 * GBPS) + 1e-5)  # 2(n-1) steps of X/n plus latency
    fwd = _fwd_flops_per_seq(4, 256, 128, 1000) / 50e12
    assert two.dp_sync_s == pytest.approx(ring, rel=1e-9)
    assert two.iteration_s == pytest.approx(4 * 3 * fwd + ring, rel=1e-9)
    assert sum(two.link_bytes.values()) == pytest.approx(2 * (2 * (2 - 1) / 2) * grads)


def test_two_nodes_of_one_cluster_meet_through_the_sync_mode_not_every_step() -> None:
    # The runtime runs one torchrun group per node: replicas on two nodes of one cluster average
    # through the job's sync (here every 10 steps), not in a per-step gradient all-reduce.
    spec = _spec(sync={"mode": "local_sgd", "every": 10})
    snap = _snapshot([("c", "r", 2, 1, 100.0)])
    two = simulate(spec, _option(spec, snap, 2, 1, 1), snap)
    assert two.dp_sync_s == 0.0
    assert two.wan_exchange_s > 0
    assert two.wan_sync_s == pytest.approx(two.wan_exchange_s / 10)
    assert set(two.wan_link_bytes) == {"fabric:c"}  # the two leaders talk over the cluster's fabric


@pytest.mark.parametrize("mode", ["ssp", "async"])
def test_ssp_and_async_exchange_once_a_round(mode: str) -> None:
    snap = _snapshot([("a", "r1", 1, 1, 100.0), ("b", "r2", 1, 1, 100.0)], wan=0.01)
    every = [
        simulate(s, _option(s, snap, 2, 1, 1), snap)
        for s in (_spec(sync={"mode": mode, "every": h, "staleness": 0}) for h in (1, 10))
    ]
    assert every[0].wan_exchange_s == pytest.approx(every[1].wan_exchange_s)
    assert every[1].wan_sync_s < every[0].wan_sync_s / 5


def test_a_pipeline_across_regions_pays_the_wan_hops() -> None:
    spec = _spec()
    near = _snapshot([("a", "r1", 1, 2, 100.0)])
    far = _snapshot([("a", "r1", 1, 1, 100.0), ("b", "r2", 1, 1, 100.0)], wan=1.0)
    n = simulate(spec, _option(spec, near, 1, 1, 2), near)
    f = simulate(spec, _option(spec, far, 1, 1, 2), far)
    assert f.pp_comm_s > n.pp_comm_s
    assert f.bubble_s == pytest.approx(n.bubble_s) and f.compute_s == pytest.approx(n.compute_s)
    act = 128 * 256 * 4.0  # one fp32 activation of a micro-batch
    assert f.link_bytes["link:r1->r2"] == pytest.approx(8 * act)
    assert f.link_bytes["link:r2->r1"] == pytest.approx(8 * act)


def test_cross_region_sync_is_amortised_over_its_interval() -> None:
    snap = _snapshot([("a", "r1", 1, 1, 100.0), ("b", "r2", 1, 1, 100.0)], wan=1.0)
    every = _spec(sync={"mode": "sync", "compression": "none"})
    rounds = _spec(sync={"mode": "local_sgd", "every": 10, "compression": "none"})
    e = simulate(every, _option(every, snap, 2, 1, 1), snap)
    r = simulate(rounds, _option(rounds, snap, 2, 1, 1), snap)
    n_params = workload(every, 1, 1, 1).n_params
    exchange = 2 * (4.0 * n_params / 2 / (1.0 * GBPS) + 0.05)
    assert e.wan_exchange_s == pytest.approx(exchange, rel=1e-9)
    assert e.wan_sync_s == pytest.approx(exchange, rel=1e-9)
    assert r.wan_sync_s == pytest.approx(exchange / 10, rel=1e-9)
    assert e.dp_sync_s == 0.0  # one replica per group: no in-group ring


_SHAPES = [(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2), (2, 1, 2), (2, 2, 1), (1, 2, 2), (4, 1, 1)]


@settings(max_examples=30, deadline=None)
@given(
    shape=st.sampled_from(_SHAPES),
    scale=st.floats(1.0, 100.0),
    split=st.booleans(),
    schedule=st.sampled_from(["1f1b", "gpipe"]),
    mode=st.sampled_from(["sync", "local_sgd", "diloco", "gossip"]),
)
def test_more_bandwidth_never_makes_a_step_slower(
    shape, scale: float, split: bool, schedule: str, mode: str
) -> None:
    dp, tp, pp = shape
    spec = _spec(sync={"mode": mode, "every": 5})
    layout = [("a", "r1", 2, 2, 50.0), ("b", "r2", 2, 2, 25.0)] if split else [("a", "r1", 2, 4, 50.0)]
    slow = _snapshot(layout, wan=2.0)
    fast = _snapshot([(c, r, n, k, bw * scale) for c, r, n, k, bw in layout], wan=2.0 * scale)
    s = simulate(spec, _option(spec, slow, dp, tp, pp, schedule=schedule), slow)
    f = simulate(spec, _option(spec, fast, dp, tp, pp, schedule=schedule), fast)
    assert f.step_s <= s.step_s * (1 + 1e-9)
    assert f.compute_s == pytest.approx(s.compute_s)


@settings(max_examples=20, deadline=None)
@given(tp=st.sampled_from([1, 2]), pp=st.sampled_from([1, 2]), schedule=st.sampled_from(["1f1b", "gpipe"]))
def test_more_replicas_of_the_same_speed_never_add_compute_per_step(tp: int, pp: int, schedule: str) -> None:
    spec = _spec(batch_seqs=16)
    snap = _snapshot([("a", "r1", 4, 4, 100.0)])
    per_step = [
        simulate(spec, _option(spec, snap, dp, tp, pp, schedule=schedule), snap).compute_s for dp in (1, 2, 4)
    ]
    assert per_step[0] >= per_step[1] >= per_step[2]
    assert per_step[0] == pytest.approx(4 * per_step[2])


def _with_runtime(option: PlanOption, overlap: bool) -> PlanOption:
    runtime = RuntimeSettings(
        checkpoint_every=100,
        checkpoint_write_s=0.0,
        checkpoint_fraction=0.0,
        overlap=overlap,
        overlap_steps=1 if overlap else None,
    )
    return option.model_copy(update={"runtime": runtime})


def test_two_clusters_of_one_region_exchange_full_duplex() -> None:
    # The region's local link (100 Gb/s by default) is each cluster's port, one pipe each way:
    # the two pushes of a two-participant exchange cross it at once, each at the full rate.
    spec = _spec(sync={"mode": "local_sgd", "every": 10, "compression": "none"})
    snap = _snapshot([("a", "r", 1, 1, 400.0), ("b", "r", 1, 1, 400.0)])
    got = simulate(spec, _option(spec, snap, 2, 1, 1), snap, call_s=0.002)
    payload = 4.0 * workload(spec, 1, 1, 1).n_params
    assert got.wan_exchange_s == pytest.approx(payload / (100 * GBPS) + 2 * 0.0005 + 0.002, rel=1e-9)
    assert got.wan_link_bytes == {"link:r->r": pytest.approx(2 * payload)}


def test_async_calls_the_parameter_server_update_up_parameters_back() -> None:
    spec = _spec(sync={"mode": "async", "every": 10, "compression": "int8"})
    snap = _snapshot([("a", "r1", 1, 1, 100.0), ("b", "r2", 1, 1, 100.0)], wan=1.0)
    got = simulate(spec, _option(spec, snap, 2, 1, 1), snap, call_s=0.002, param_s=1e-9)
    n = workload(spec, 1, 1, 1).n_params
    up, down = n * (1.0 + 4.0 / 2048), n * 2.0  # int8 update, bf16 parameters
    expected = (up + down) / (1.0 * GBPS) + 2 * 0.05 + 0.002 + n * 1e-9
    assert got.wan_exchange_s == pytest.approx(expected, rel=1e-9)
    assert sum(got.wan_link_bytes.values()) == pytest.approx(up + down)


def test_ssp_pushes_its_update_to_every_peer() -> None:
    spec = _spec(sync={"mode": "ssp", "every": 10, "compression": "bf16", "staleness": 1})
    snap = _snapshot([("a", "r", 1, 1, 400.0), ("b", "r", 1, 1, 400.0), ("c", "r", 1, 1, 400.0)])
    got = simulate(spec, _option(spec, snap, 3, 1, 1), snap)
    payload = 2.0 * workload(spec, 1, 1, 1).n_params
    # Each cluster's port into the region carries its two pushes together.
    assert got.wan_exchange_s == pytest.approx(2 * payload / (100 * GBPS) + 2 * 0.0005, rel=1e-9)
    assert sum(got.wan_link_bytes.values()) == pytest.approx(6 * payload)


def test_top_k_rides_the_ring_at_its_own_size() -> None:
    spec = _spec(sync={"mode": "local_sgd", "every": 10, "compression": "topk", "topk_ratio": 0.1})
    snap = _snapshot([(c, f"r{c}", 1, 1, 100.0) for c in "abc"], wan=1.0)
    got = simulate(spec, _option(spec, snap, 3, 1, 1), snap)
    payload = 0.1 * 8.0 * workload(spec, 1, 1, 1).n_params
    assert sum(got.wan_link_bytes.values()) == pytest.approx(3 * 2 * 2 / 3 * payload)


@pytest.mark.parametrize("mode", ["async", "diloco"])
def test_an_overlapped_exchange_hides_behind_a_round_of_steps(mode: str) -> None:
    spec = _spec(sync={"mode": mode, "every": 4})
    snap = _snapshot([("a", "r1", 1, 1, 100.0), ("b", "r2", 1, 1, 100.0)], wan=0.05)
    option = _option(spec, snap, 2, 1, 1)
    blocking = simulate(spec, _with_runtime(option, False), snap)
    hidden = simulate(spec, _with_runtime(option, True), snap)
    assert blocking.wan_sync_s == pytest.approx(blocking.wan_exchange_s / 4)
    exposed = max(0.0, hidden.wan_exchange_s - 4 * hidden.iteration_s) / 4
    assert hidden.wan_sync_s == pytest.approx(exposed) and 0 < exposed < blocking.wan_sync_s
