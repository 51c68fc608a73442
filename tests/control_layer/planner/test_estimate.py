"""estimate_option on hand-written task lists: numbers by hand, and the errors it raises."""

from __future__ import annotations

import pytest

from contracts.errors import InvalidArgument
from contracts.job_spec import JobSpec
from control_layer.planner import cost_model as cm
from control_layer.planner.estimate import estimate_option
from control_layer.planner.placement import Placement
from control_layer.planner.plan_types import PlannedTask, RuntimeSettings
from control_layer.planner.snapshot import ResourceSnapshot


def _snap() -> ResourceSnapshot:
    def node(nid: str, model: str, mem: float, tf: float, n: int) -> dict:
        return {
            "id": nid,
            "devices": [{"index": i, "model": model, "memory_gb": mem, "tflops": tf} for i in range(n)],
        }

    return ResourceSnapshot.model_validate(
        {
            "regions": [{"name": "eu"}, {"name": "us"}],
            "clusters": [
                {
                    "id": "a",
                    "region": "eu",
                    "price_per_device_hour": 2.0,
                    "nodes": [node("a0", "H100", 80, 700, 4)],
                },
                {
                    "id": "b",
                    "region": "us",
                    "price_per_device_hour": 1.0,
                    "nodes": [node("b0", "A100", 40, 300, 4)],
                },
                {
                    "id": "c",
                    "region": "eu",
                    "price_per_device_hour": 1.0,
                    "nodes": [node("c0", "L4", 24, 120, 2)],
                },
            ],
            "links": [
                {
                    "src": "eu",
                    "dst": "us",
                    "bandwidth_gbps": 8,
                    "latency_ms": 100,
                    "egress_price_per_gb": 0.05,
                }
            ],
        }
    )


def _spec(**sync) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "t",
            "model": {"n_layers": 4, "d_model": 512, "n_heads": 8, "vocab": 8192, "seq_len": 512},
            "training": {"steps": 1000, "global_batch_tokens": 512 * 8},
            "sync": {"mode": "sync", "compression": "none", **sync},
        }
    )


def _tasks(placement: list[tuple[str, str, int]]) -> list[PlannedTask]:
    return [
        PlannedTask(dp_rank=i, pp_stage=0, tp_rank=0, cluster=c, node=n, device=d)
        for i, (c, n, d) in enumerate(placement)
    ]


def test_single_replica_by_hand() -> None:
    spec = _spec()
    est = estimate_option(Placement(spec, _snap(), _tasks([("a", "a0", 0)]), dp=1, tp=1, pp=1, zero=0))
    t_mb = cm.flops_per_token(spec.model, False) * 512 / (700e12 * cm.DEFAULT_DEVICE_EFFICIENCY)
    assert est.step_s.compute == pytest.approx(8 * t_mb)
    assert est.step_s.total == pytest.approx(est.step_s.compute)
    # Nothing measured: the default start-up and teardown of a worker, around the steps.
    assert est.startup_s == cm.DEFAULT_STARTUP_S and est.teardown_s == cm.DEFAULT_TEARDOWN_S
    assert est.duration_s == pytest.approx(
        cm.DEFAULT_STARTUP_S + 1000 * est.step_s.total + cm.DEFAULT_TEARDOWN_S
    )
    assert est.cost.devices == pytest.approx(2.0 * est.duration_s / 3600)
    assert est.cost.egress == 0 and est.wan_bytes_per_step == 0
    assert est.tokens_per_s == pytest.approx(512 * 8 / est.step_s.total)


def test_two_regions_pay_wan_sync_and_egress() -> None:
    spec = _spec()
    tasks = _tasks([("a", "a0", 0), ("b", "b0", 0)])
    est = estimate_option(Placement(spec, _snap(), tasks, dp=2, tp=1, pp=1, zero=0))
    payload = spec.model.n_params * 4.0
    bw = cm.bytes_per_s(8, cm.DEFAULT_WAN_GOODPUT)
    # Two regions: each leader pushes S bytes to the other (one call), 2 latency hops, and works on
    # every parameter once (flatten, codec, mean, in-node broadcast); the exchange costs e once.
    t_sync = payload / bw + 2 * 0.1 + cm.DEFAULT_EXCHANGE_CALL_S
    t_sync += spec.model.n_params * cm.DEFAULT_EXCHANGE_PARAM_S + cm.DEFAULT_EXCHANGE_FIXED_S
    assert est.step_s.wan_sync == pytest.approx(t_sync)
    # The A100 replica is the slower one and sets the step.
    t_mb = cm.flops_per_token(spec.model, False) * 512 / (300e12 * cm.DEFAULT_DEVICE_EFFICIENCY)
    assert est.step_s.compute == pytest.approx(4 * t_mb)
    assert est.cost.egress == pytest.approx(1000 * 2 * payload / 1e9 * 0.05)
    assert est.cost.total == pytest.approx(est.cost.devices + est.cost.egress)
    assert est.wan_bytes_per_step == pytest.approx(2 * payload)


def test_replicas_sharing_a_cluster_all_reduce_there() -> None:
    spec = _spec()
    est = estimate_option(
        Placement(spec, _snap(), _tasks([("a", "a0", 0), ("a", "a0", 1)]), dp=2, tp=1, pp=1, zero=0)
    )
    assert est.step_s.dp_comm > 0 and est.step_s.wan_sync == 0


def test_diloco_overlaps_what_sync_blocks_on() -> None:
    tasks = _tasks([("a", "a0", 0), ("b", "b0", 0)])
    blocking = estimate_option(Placement(_spec(), _snap(), tasks, dp=2, tp=1, pp=1, zero=0))
    overlapped = estimate_option(
        Placement(_spec(mode="diloco", every=100), _snap(), tasks, dp=2, tp=1, pp=1, zero=0)
    )
    assert overlapped.step_s.wan_sync < blocking.step_s.wan_sync
    assert overlapped.cost.egress == pytest.approx(blocking.cost.egress / 100)


def test_tensor_parallel_replica() -> None:
    tasks = [
        PlannedTask(dp_rank=0, pp_stage=0, tp_rank=r, cluster="a", node="a0", device=r) for r in range(2)
    ]
    est = estimate_option(Placement(_spec(), _snap(), tasks, dp=1, tp=2, pp=1, zero=0))
    assert est.step_s.tp_comm > 0


@pytest.mark.parametrize(
    ("tasks", "dp", "match"),
    [
        ([("a", "a0", 0)], 2, "dp ranks"),
        ([("a", "a0", 0), ("z", "a0", 1)], 2, "unknown cluster"),
        ([("a", "a0", 0), ("a", "a0", 9)], 2, "unknown device"),
        ([("a", "a0", 0), ("a", "a0", 1), ("a", "a0", 2)], 3, "does not split"),
    ],
)
def test_bad_task_lists(tasks: list, dp: int, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        estimate_option(Placement(_spec(), _snap(), _tasks(tasks), dp=dp, tp=1, pp=1, zero=0))


def test_mixed_models_in_a_replica_are_refused() -> None:
    tasks = [
        PlannedTask(dp_rank=0, pp_stage=0, tp_rank=0, cluster="a", node="a0", device=0),
        PlannedTask(dp_rank=0, pp_stage=1, tp_rank=0, cluster="c", node="c0", device=0),
    ]
    with pytest.raises(InvalidArgument, match="mixes device models"):
        estimate_option(Placement(_spec(), _snap(), tasks, dp=1, tp=1, pp=2, zero=0))


def test_out_of_memory_is_refused() -> None:
    big = JobSpec.model_validate(
        {
            "name": "big",
            "model": {"n_layers": 32, "d_model": 4096, "n_heads": 32, "vocab": 32000, "seq_len": 2048},
            "training": {"steps": 10, "global_batch_tokens": 2048},
        }
    )
    with pytest.raises(InvalidArgument, match="needs .* GB per device"):
        estimate_option(Placement(big, _snap(), _tasks([("c", "c0", 0)]), dp=1, tp=1, pp=1, zero=0))


def test_a_measured_link_is_not_discounted_again() -> None:
    """A probe's figure is already what a stream achieved; only a declared figure is nominal."""
    spec = _spec()
    tasks = _tasks([("a", "a0", 0), ("b", "b0", 0)])
    declared = estimate_option(Placement(spec, _snap(), tasks, dp=2, tp=1, pp=1, zero=0))
    data = _snap().model_dump()
    data["links"] = [{**ln, "source": "measured"} for ln in data["links"]]
    measured = ResourceSnapshot.model_validate(data)
    est = estimate_option(Placement(spec, measured, tasks, dp=2, tp=1, pp=1, zero=0))
    payload = spec.model.n_params * 4.0
    assert est.step_s.wan_sync == pytest.approx(
        payload / cm.bytes_per_s(8, 1.0)
        + 2 * 0.1
        + cm.DEFAULT_EXCHANGE_CALL_S
        + spec.model.n_params * cm.DEFAULT_EXCHANGE_PARAM_S
        + cm.DEFAULT_EXCHANGE_FIXED_S
    )
    assert est.step_s.wan_sync < declared.step_s.wan_sync
    assert est.basis is not None and set(est.basis.goodput.values()) == {cm.MEASURED_WAN_GOODPUT}


def test_the_runtime_settings_are_priced_as_the_workers_run_them() -> None:
    """Overlap hides the exchange behind the delay's local steps (what does not fit blocks) and
    the final round has nothing to hide behind; checkpoints are priced at the runtime's interval."""
    spec = _spec(mode="diloco", every=10)
    tasks = _tasks([("a", "a0", 0), ("b", "b0", 0)])
    kw = {"dp": 2, "tp": 1, "pp": 1, "zero": 0}
    blocking = estimate_option(Placement(spec, _snap(), tasks, **kw))
    base = {"checkpoint_every": spec.training.steps, "checkpoint_write_s": 0.0, "checkpoint_fraction": 0.0}
    overlap = RuntimeSettings(**base, overlap=True, overlap_steps=5, fragments=1)
    hidden = estimate_option(Placement(spec, _snap(), tasks, **kw), runtime=overlap)
    t_local = blocking.step_s.total - blocking.step_s.wan_sync
    t_sync = blocking.step_s.wan_sync * 10  # one blocking exchange every 10 steps
    exposed = max(0.0, t_sync - 5 * t_local)
    assert hidden.step_s.wan_sync == pytest.approx(exposed / 10)
    assert hidden.final_sync_s == pytest.approx(t_sync)
    assert blocking.final_sync_s == 0.0
    every_step = RuntimeSettings(**{**base, "checkpoint_every": 1, "checkpoint_write_s": 0.5})
    often = estimate_option(Placement(spec, _snap(), tasks, **kw), runtime=every_step)
    assert often.step_s.checkpoint == pytest.approx(0.5) and blocking.step_s.checkpoint == 0.0


def _fabric_snap() -> ResourceSnapshot:
    """Region eu: cluster f (two nodes, a 400 Gb/s fabric) and cluster g (one node), over eu's
    local link (declared at 10 Gb/s); region us: cluster h, 8 Gb/s from eu."""

    def node(nid: str) -> dict:
        return {"id": nid, "devices": [{"index": 0, "model": "H100", "memory_gb": 80, "tflops": 700}]}

    def cluster(cid: str, region: str, nodes: list[str]) -> dict:
        return {
            "id": cid,
            "region": region,
            "price_per_device_hour": 1.0,
            "intra_bandwidth_gbps": 400,
            "intra_latency_ms": 0.01,
            "nodes": [node(n) for n in nodes],
        }

    return ResourceSnapshot.model_validate(
        {
            "regions": [{"name": "eu"}, {"name": "us"}],
            "clusters": [
                cluster("f", "eu", ["f0", "f1", "f2"]),
                cluster("g", "eu", ["g0"]),
                cluster("h", "us", ["h0"]),
            ],
            "links": [
                {"src": "eu", "dst": "eu", "bandwidth_gbps": 10, "latency_ms": 1},
                {"src": "eu", "dst": "us", "bandwidth_gbps": 8, "latency_ms": 50},
            ],
        }
    )


def _ring_s(spec: JobSpec, participants: int, gbps: float, one_way_s: float, goodput: float) -> float:
    """The runtime's ring by hand: 2(P-1) calls of a 1/P chunk (P = 2: one push of the payload
    each way), each call a round trip with the call's fixed cost."""
    payload = spec.model.n_params * 4.0
    hop = one_way_s + cm.DEFAULT_EXCHANGE_CALL_S / 2.0
    if participants == 2:
        return payload / (gbps * 1e9 / 8 * goodput) + 2 * hop
    steps = 2 * (participants - 1)
    return steps * (payload / participants / (gbps * 1e9 / 8 * goodput) + 2 * hop)


def test_two_nodes_of_one_cluster_exchange_over_its_fabric() -> None:
    spec = _spec()
    tasks = _tasks([("f", "f0", 0), ("f", "f1", 0)])
    est = estimate_option(Placement(spec, _fabric_snap(), tasks, dp=2, tp=1, pp=1, zero=0))
    # The exchange's fixed cost and the leaders' per-parameter work are the same whichever link
    # the exchange crosses.
    param_s = spec.model.n_params * cm.DEFAULT_EXCHANGE_PARAM_S + cm.DEFAULT_EXCHANGE_FIXED_S
    want = _ring_s(spec, 2, 400, 0.01e-3, cm.DEFAULT_LAN_GOODPUT) + param_s
    assert est.step_s.wan_sync == pytest.approx(want)
    assert est.cost.egress == 0


def test_nodes_of_two_clusters_ring_over_the_local_link() -> None:
    """Four nodes in one region, two clusters: one flat ring whose slowest hop is the local link."""
    spec = _spec()
    tasks = _tasks([("f", "f0", 0), ("f", "f1", 0), ("f", "f2", 0), ("g", "g0", 0)])
    est = estimate_option(Placement(spec, _fabric_snap(), tasks, dp=4, tp=1, pp=1, zero=0))
    param_s = spec.model.n_params * cm.DEFAULT_EXCHANGE_PARAM_S + cm.DEFAULT_EXCHANGE_FIXED_S
    assert est.step_s.wan_sync == pytest.approx(_ring_s(spec, 4, 10, 1e-3, cm.DEFAULT_LAN_GOODPUT) + param_s)


def test_regions_of_several_nodes_exchange_hierarchically_where_that_pays() -> None:
    """Three nodes in eu's cluster f and one in us, the WAN 50 times slower than f's fabric: eu's
    members push to their head over the fabric, the two heads ring over the WAN (two calls), the
    head hands the result back; cheaper than one flat ring of four whose every hop pays the WAN.
    The exchange's fixed cost and per-parameter work are paid once, and each region's egress is
    one head's 2(G-1)/G of the payload."""
    spec = _spec()
    snap = _fabric_snap()
    tasks = _tasks([("f", "f0", 0), ("f", "f1", 0), ("f", "f2", 0), ("h", "h0", 0)])
    est = estimate_option(Placement(spec, snap, tasks, dp=4, tp=1, pp=1, zero=0))
    param_s = spec.model.n_params * cm.DEFAULT_EXCHANGE_PARAM_S + cm.DEFAULT_EXCHANGE_FIXED_S
    payload = spec.model.n_params * 4.0
    fabric_hop = 0.01e-3 + cm.DEFAULT_EXCHANGE_CALL_S / 2.0
    wan_hop = 50e-3 + cm.DEFAULT_EXCHANGE_CALL_S / 2.0
    local = 2 * (2 * payload / (400e9 / 8 * cm.DEFAULT_LAN_GOODPUT) + 2 * fabric_hop)
    wan = payload / (8e9 / 8 * cm.DEFAULT_WAN_GOODPUT) + 2 * 2 * wan_hop
    assert est.step_s.wan_sync == pytest.approx(local + wan + param_s)
    assert est.step_s.wan_sync < _ring_s(spec, 4, 8, 50e-3, cm.DEFAULT_WAN_GOODPUT) + param_s
    assert est.basis.exchange.hierarchical and est.basis.exchange.rounds == 2
    assert est.basis.exchange.local_s == pytest.approx(local)
    assert est.wan_bytes_per_step == pytest.approx(2 * payload)
    assert est.cost.egress == 0  # the links declare no egress price


def test_the_flat_ring_stays_where_hierarchy_does_not_pay() -> None:
    """One node a region: no region has members to gather, the flat ring runs."""
    spec = _spec()
    tasks = _tasks([("f", "f0", 0), ("h", "h0", 0)])
    est = estimate_option(Placement(spec, _fabric_snap(), tasks, dp=2, tp=1, pp=1, zero=0))
    param_s = spec.model.n_params * cm.DEFAULT_EXCHANGE_PARAM_S + cm.DEFAULT_EXCHANGE_FIXED_S
    assert est.step_s.wan_sync == pytest.approx(_ring_s(spec, 2, 8, 50e-3, cm.DEFAULT_WAN_GOODPUT) + param_s)
    assert not est.basis.exchange.hierarchical
