"""Node-level fabric figures: a node's own port into its cluster's fabric narrows the cluster's;
the estimate prices each pipeline boundary across the two nodes' ports, as the independent
simulator does, and spanning placement runs stages down the fastest ports."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.sim import simulate
from contracts.errors import InvalidArgument, NoFeasiblePlan
from contracts.job_spec import JobSpec
from control_layer.planner import estimate_option, plan
from control_layer.planner.fleet import filter_fleet
from control_layer.planner.placement import Placement
from control_layer.planner.plan_types import PlannedTask, PlanOption
from control_layer.planner.search import precision_groups, with_precision
from control_layer.planner.snapshot import ResourceSnapshot
from control_layer.planner.spanning import spanning_options
from tests.control_layer.planner.test_node_group_pricing import GOODPUT, SPEC, _blocks, _iteration, _option

PORTS = [None, 10.0, 25.0, 100.0, 400.0]


def _snapshot(ports: list[float | None], devices: int, fabric: float = 100.0, lat=None) -> ResourceSnapshot:
    devs = [{"index": k, "model": "H100", "memory_gb": 80, "tflops": 400} for k in range(devices)]
    lat = lat or [None] * len(ports)
    nodes = [
        {"id": f"n{i}", "devices": devs, "fabric_bandwidth_gbps": p, "fabric_latency_ms": la}
        for i, (p, la) in enumerate(zip(ports, lat, strict=True))
    ]
    return ResourceSnapshot.model_validate(
        {
            "regions": [{"name": "r"}],
            "clusters": [
                {
                    "id": "c",
                    "region": "r",
                    "price_per_device_hour": 2.0,
                    "intra_bandwidth_gbps": fabric,
                    "nodes": nodes,
                }
            ],
        }
    )


def _cases(seed: int, n: int) -> list[tuple]:
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        dp, tp, pp, devices = (
            rng.choice([1, 2]),
            rng.choice([1, 2]),
            rng.choice([2, 4]),
            rng.choice([1, 2, 4]),
        )
        # tp within a node, as spanning places it (its all-reduces stay on the node)
        if (dp * tp * pp) % devices or dp * tp * pp // devices < 2 or tp > devices:
            continue
        n_nodes = dp * tp * pp // devices
        ports = [rng.choice(PORTS) for _ in range(n_nodes)]
        lat = [rng.choice([None, 0.005, 0.05]) for _ in range(n_nodes)]
        out.append((dp, tp, pp, devices, ports, lat, rng.choice([25.0, 100.0, 400.0])))
    return out


def _error(dp, tp, pp, devices, ports, lat, fabric) -> float:
    snap = _snapshot(ports, devices, fabric, lat)
    tasks = _blocks(dp, tp, pp, devices)
    est = estimate_option(Placement(SPEC, snap, tasks, dp=dp, tp=tp, pp=pp, zero=0))
    sim = simulate(SPEC, _option(tasks, dp, tp, pp, est), snap, **GOODPUT).step_s
    return abs(_iteration(est) - sim) / sim


def test_groups_across_nodes_with_their_own_ports_are_priced_within_ten_percent_of_the_simulator_p90() -> (
    None
):
    """Generated groups over nodes whose ports differ (10 to 400 Gb/s, some at the cluster's)."""
    errors = sorted(_error(*case) for case in _cases(11, 200))
    assert errors[int(0.9 * len(errors))] <= 0.10, errors[-10:]
    # Worst: a slow port carrying both directions; the estimate books its transfers one after
    # another where the simulator shares the port between them.
    assert errors[-1] <= 0.25


def test_a_node_without_its_own_figures_prices_as_before() -> None:
    """Ports at or above the cluster's change nothing: the cluster's figure caps them."""
    tasks = _blocks(2, 1, 4, 2)
    plain = estimate_option(Placement(SPEC, _snapshot([None] * 4, 2), tasks, dp=2, tp=1, pp=4, zero=0))
    fast = estimate_option(Placement(SPEC, _snapshot([400.0] * 4, 2), tasks, dp=2, tp=1, pp=4, zero=0))
    assert fast.step_s == plain.step_s


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ports=st.lists(st.sampled_from(PORTS), min_size=4, max_size=4), slow=st.integers(0, 3))
def test_a_slower_port_never_makes_a_step_faster(ports: list[float | None], slow: int) -> None:
    tasks = _blocks(1, 1, 4, 1)
    before = estimate_option(Placement(SPEC, _snapshot(ports, 1), tasks, dp=1, tp=1, pp=4, zero=0))
    slower = list(ports)
    slower[slow] = 1.0
    after = estimate_option(Placement(SPEC, _snapshot(slower, 1), tasks, dp=1, tp=1, pp=4, zero=0))
    assert after.step_s.pp_comm >= before.step_s.pp_comm
    assert after.step_s.total >= before.step_s.total


@pytest.mark.parametrize("field", ["fabric_bandwidth_gbps", "fabric_latency_ms"])
def test_a_node_figure_out_of_bounds_is_refused_with_its_field(field: str) -> None:
    bad = {"id": "n0", "devices": [], field: -1.0}
    raw = {"clusters": [{"id": "c", "region": "r", "price_per_device_hour": 1.0, "nodes": [bad]}]}
    with pytest.raises(InvalidArgument, match=field):
        ResourceSnapshot.from_json(json.dumps(raw))


BIG = JobSpec.model_validate(
    {
        "name": "big",
        "model": {"n_layers": 32, "d_model": 4096, "n_heads": 32, "vocab": 32000, "seq_len": 1024},
        "training": {"steps": 100, "global_batch_tokens": 131072},
        "sync": {"mode": "sync"},
    }
)


def _spanning(spec: JobSpec, snap: ResourceSnapshot) -> list[PlanOption]:
    out: list[PlanOption] = []
    for precision, pools in precision_groups(spec, filter_fleet(spec, snap).pools):
        out += spanning_options(with_precision(spec, precision), snap, pools, None)
    return out


# Devices too small for a replica of BIG on a node of two: 40 GB (with its bf16 weight copies,
# gradients and optimizer state, BIG needs more than two of them, as the worker holds it).
SMALL = ("A100-40GB", 40, 120)


def _big_snapshot(ports: list[float | None], device: tuple[str, float, float] = SMALL) -> ResourceSnapshot:
    model, memory_gb, tflops = device
    devs = [{"index": k, "model": model, "memory_gb": memory_gb, "tflops": tflops} for k in range(2)]
    nodes = [{"id": f"n{i}", "devices": devs, "fabric_bandwidth_gbps": p} for i, p in enumerate(ports)]
    return ResourceSnapshot.model_validate(
        {
            "regions": [{"name": "r"}],
            "clusters": [
                {
                    "id": "c",
                    "region": "r",
                    "price_per_device_hour": 1.0,
                    "intra_bandwidth_gbps": 200.0,
                    "nodes": nodes,
                }
            ],
        }
    )


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ports=st.permutations([5.0, 5.0, 200.0, 200.0, 200.0, 200.0, 5.0, 5.0]))
def test_spanning_runs_stages_down_the_fastest_ports(ports: list[float]) -> None:
    """Wherever the fast nodes sit in the cluster's list, a replica that needs fewer nodes than
    there are fast ones runs on fast nodes only, and its boundaries are as fast as the ports allow."""
    snap = _big_snapshot(list(ports))
    options = _spanning(BIG, snap)
    assert options
    fast = {f"n{i}" for i, p in enumerate(ports) if p == 200.0}
    for opt in options:
        nodes = {t.node for t in opt.tasks}
        if len(nodes) <= len(fast):
            assert nodes <= fast, (opt.dp, opt.tp, opt.pp, sorted(nodes))


def test_the_order_of_stages_beats_the_listed_order_when_ports_differ() -> None:
    """A pipeline over a slow and fast nodes listed slow-first: the spanning option is faster than
    the same roles dealt in the listed order."""
    snap = _big_snapshot([5.0, 200.0, 200.0, 200.0, 200.0])
    options = _spanning(BIG, snap)
    assert options
    for opt in options:
        if len({t.node for t in opt.tasks}) > 4:
            continue
        listed = [
            PlannedTask(**{**t.model_dump(), "node": f"n{int(t.node[1:]) - 1}"}) for t in opt.tasks
        ]  # the same roles one node earlier in the list: onto the slow node first
        spec = with_precision(BIG, opt.precision)
        est = estimate_option(Placement(spec, snap, listed, dp=opt.dp, tp=opt.tp, pp=opt.pp, zero=opt.zero))
        mine = estimate_option(
            Placement(spec, snap, opt.tasks, dp=opt.dp, tp=opt.tp, pp=opt.pp, zero=opt.zero)
        )
        assert mine.step_s.total < est.step_s.total


def _two_clusters(
    n_a: int,
    n_b: int,
    devices: int,
    link_gbps: float,
    link_ms: float,
    reachable: bool = True,
    device: tuple[str, float, float] = ("H100", 80, 400),
    price: float = 2.0,
    fabric_gbps: float = 100.0,
    private: bool = True,
) -> ResourceSnapshot:
    """Nodes n0..n{n_a-1} in cluster a, the next n_b in cluster b, one region; the region's local
    link joins the two clusters, declared ``private``."""
    model, memory_gb, tflops = device
    devs = [{"index": k, "model": model, "memory_gb": memory_gb, "tflops": tflops} for k in range(devices)]

    def nodes(first: int, n: int) -> list[dict]:
        return [
            {"id": f"n{i}", "devices": devs, "cross_cluster_groups": reachable}
            for i in range(first, first + n)
        ]

    return ResourceSnapshot.model_validate(
        {
            "regions": [{"name": "r"}],
            "links": [
                {
                    "src": "r",
                    "dst": "r",
                    "bandwidth_gbps": link_gbps,
                    "latency_ms": link_ms,
                    "private": private,
                }
            ],
            "clusters": [
                {
                    "id": cid,
                    "region": "r",
                    "price_per_device_hour": price,
                    "intra_bandwidth_gbps": fabric_gbps,
                    "nodes": ns,
                }
                for cid, ns in (("a", nodes(0, n_a)), ("b", nodes(n_a, n_b)))
            ],
        }
    )


def _split_shape(rng: random.Random) -> tuple[int, int, int, int, int, int] | None:
    """A group's (dp, tp, pp, devices per node) and its nodes in cluster a (its first stages) and
    in b, split on a node boundary; None where the drawn shape does not split so."""
    dp, tp, pp, devices = (
        rng.choice([1, 2]),
        rng.choice([1, 2]),
        rng.choice([2, 4]),
        rng.choice([1, 2, 4]),
    )
    split = rng.randrange(1, pp)
    if tp > devices or (split * dp * tp) % devices or (dp * tp * pp) % devices:
        return None
    n_a = split * dp * tp // devices
    return dp, tp, pp, devices, n_a, dp * tp * pp // devices - n_a


def _cross_cases(seed: int, n: int) -> list[tuple]:
    """Groups whose first stages are in cluster a and the rest in cluster b (the split falls on a
    node boundary, so each stage's replicas meet inside one cluster)."""
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        shape = _split_shape(rng)
        if shape is None:
            continue
        dp, tp, pp, devices, n_a, n_b = shape
        out.append(
            (dp, tp, pp, devices, n_a, n_b, rng.choice([1.0, 10.0, 25.0, 100.0]), rng.choice([0.1, 1.0, 5.0]))
        )
    return out


def _cross_error(dp, tp, pp, devices, n_a, n_b, link_gbps, link_ms) -> float:
    snap = _two_clusters(n_a, n_b, devices, link_gbps, link_ms)
    tasks = [
        PlannedTask(**{**t.model_dump(), "cluster": "a" if int(t.node[1:]) < n_a else "b"})
        for t in _blocks(dp, tp, pp, devices)
    ]
    est = estimate_option(Placement(SPEC, snap, tasks, dp=dp, tp=tp, pp=pp, zero=0))
    opt = _option(tasks, dp, tp, pp, est).model_copy(update={"replicas_per_cluster": {"a": dp}})
    sim = simulate(SPEC, opt, snap, **GOODPUT).step_s
    return abs(_iteration(est) - sim) / sim


def test_groups_across_two_clusters_are_priced_within_ten_percent_of_the_simulator_p90() -> None:
    """Generated pipelines whose boundary between the clusters crosses the region's local link
    (1 to 100 Gb/s, 0.1 to 5 ms), shared by the replicas that cross it."""
    errors = sorted(_cross_error(*case) for case in _cross_cases(23, 60))
    assert errors[int(0.9 * len(errors))] <= 0.10, errors[-10:]


def test_a_group_across_clusters_needs_every_node_reachable() -> None:
    snap = _two_clusters(1, 1, 1, 10.0, 1.0, reachable=False)
    tasks = [
        PlannedTask(**{**t.model_dump(), "cluster": "a" if t.node == "n0" else "b"})
        for t in _blocks(1, 1, 2, 1)
    ]
    with pytest.raises(InvalidArgument, match="reachable from other clusters"):
        estimate_option(Placement(SPEC, snap, tasks, dp=1, tp=1, pp=2, zero=0))


def _two_big_clusters(n_a: int, n_b: int, reachable: bool, link_gbps: float = 25.0) -> ResourceSnapshot:
    """Clusters a and b of one region, nodes of two 40 GB devices each: too few in either for a
    replica of BIG."""
    return _two_clusters(n_a, n_b, 2, link_gbps, 0.5, reachable, device=SMALL, price=1.0, fabric_gbps=200.0)


@pytest.mark.parametrize(("n_a", "n_b"), [(2, 2), (3, 2), (1, 3)])
def test_a_replica_no_cluster_holds_spans_clusters_whose_nodes_declared_it(n_a: int, n_b: int) -> None:
    """Without the declaration nothing is offered; with it, a replica runs through both clusters,
    crossing the region's link at one stage boundary only (the listed order the larger one's nodes
    first; a searched order, where it walks faster, may start in the other), and the runtime's
    rules accept it with those nodes reachable."""
    from control_layer.worker_config import option_problems

    assert _spanning(BIG, _two_big_clusters(n_a, n_b, reachable=False)) == []
    snap = _two_big_clusters(n_a, n_b, reachable=True)
    options = _spanning(BIG, snap)
    assert options
    first = "a" if n_a >= n_b else "b"
    assert any({t.pp_stage: t.cluster for t in opt.tasks}[0] == first for opt in options)
    for opt in options:
        assert {t.cluster for t in opt.tasks} == {"a", "b"}
        stages = {t.pp_stage: t.cluster for t in opt.tasks}
        assert sum(stages[s] != stages[s + 1] for s in range(opt.pp - 1)) == 1
        spec = with_precision(BIG, opt.precision)
        assert option_problems(spec, opt, [t.node for t in opt.tasks]) == []
        assert option_problems(spec, opt) != []


def test_a_slower_link_between_the_clusters_makes_the_spanning_step_slower() -> None:
    fast = _spanning(BIG, _two_big_clusters(2, 2, True, link_gbps=100.0))
    slow = _spanning(BIG, _two_big_clusters(2, 2, True, link_gbps=1.0))
    assert [o.tasks for o in fast] == [o.tasks for o in slow]
    for f, s in zip(fast, slow, strict=True):
        assert s.estimates.step_s.pp_comm > f.estimates.step_s.pp_comm


def test_clusters_of_one_region_share_a_group_only_over_its_network_declared_private() -> None:
    """The region's own network between its clusters is a link too (``PUT /v1/links`` with src =
    dst): undeclared private, no replica spans the clusters, and the reasons say why."""
    assert _spanning(BIG, _two_clusters(2, 2, 2, 25.0, 0.5, device=SMALL, private=False)) == []
    with pytest.raises(NoFeasiblePlan, match=r"r \(between its clusters\)"):
        plan(BIG, _two_clusters(2, 2, 2, 25.0, 0.5, device=SMALL, private=False))
