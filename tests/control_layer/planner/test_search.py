"""The search against exhaustive enumeration on random small instances (at most 6 clusters).

Each property checks one layer: the estimator agrees with the search's own objective, the
lower bounds never exceed what a candidate can reach, the MILP is exact for its candidate, and
plan()'s best option is within 1 % of the exhaustive optimum.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from contracts.errors import NoFeasiblePlan
from contracts.job_spec import JobSpec
from control_layer.planner import plan
from control_layer.planner.bounds import lower_bounds
from control_layer.planner.candidates import enumerate_degrees
from control_layer.planner.exhaustive import all_solutions, exhaustive_best, objective_key
from control_layer.planner.fleet import filter_fleet
from control_layer.planner.milp import solve
from control_layer.planner.options import build_option
from control_layer.planner.problem import build_fleet, build_problem, evaluate
from control_layer.planner.screen import screen
from control_layer.planner.search import precision_groups, with_precision
from control_layer.planner.snapshot import ResourceSnapshot

from .fleetgen import jobs, snapshots

FAST = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


def _twin_clusters() -> ResourceSnapshot:
    """Four clusters of one node each in one region, alike but for their ids: one class whose
    members lie in separate clusters, so two of them meet over the region's local link."""

    def cluster(cid: str, node: str) -> dict:
        device = {"index": 0, "model": "T4", "memory_gb": 16.0, "tflops": 65.0, "free": True}
        return {
            "id": cid,
            "name": cid,
            "provider": "p",
            "region": "r0",
            "nodes": [{"id": node, "devices": [device]}],
            "intra_bandwidth_gbps": 25.0,
            "price_per_device_hour": 3.5,
            "spot_price_per_device_hour": 1.75,
        }

    return ResourceSnapshot.model_validate(
        {
            "regions": [{"name": "r0", "jurisdiction": "EU"}, {"name": "r1", "jurisdiction": "EU"}],
            "clusters": [
                cluster("c0", "c0n0"),
                cluster("t0", "t0c0n0"),
                cluster("t1", "t1t0c0n0"),
                cluster("t2", "t2t0c0n0"),
            ],
            "links": [{"src": "r0", "dst": "r1", "bandwidth_gbps": 1.0, "latency_ms": 20.0}],
        }
    )


def _one_two_gpu_node() -> ResourceSnapshot:
    """One node of two H100s in r0, among four regions linked pairwise at 1 Gb/s."""
    regions = ["r0", "r1", "r2", "r3"]
    device = {"model": "H100", "memory_gb": 80.0, "tflops": 700.0, "free": True}
    return ResourceSnapshot.model_validate(
        {
            "regions": [{"name": r, "jurisdiction": "EU" if i < 2 else "US"} for i, r in enumerate(regions)],
            "clusters": [
                {
                    "id": "c0",
                    "name": "c0",
                    "provider": "p",
                    "region": "r0",
                    "nodes": [{"id": "c0n0", "devices": [{"index": k, **device} for k in range(2)]}],
                    "intra_bandwidth_gbps": 25.0,
                    "price_per_device_hour": 0.5,
                }
            ],
            "links": [
                {"src": a, "dst": b, "bandwidth_gbps": 1.0, "latency_ms": 2.0}
                for i, a in enumerate(regions)
                for b in regions[i + 1 :]
            ],
        }
    )


def _small_sync_job(parallelism: object = "auto") -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "t",
            "model": {"n_layers": 2, "d_model": 512, "n_heads": 8, "vocab": 8192, "seq_len": 256},
            "training": {"steps": 100, "global_batch_tokens": 512, "precision": "auto"},
            "parallelism": parallelism,
            "sync": {"mode": "sync", "every": 1, "compression": "none", "staleness": 0, "gossip_peers": 1},
            "qos": {"objective": "cost"},
        }
    )


def _problems(spec, snap):
    filtered = filter_fleet(spec, snap)
    if not filtered.pools:
        return None, []
    ((precision, pools),) = precision_groups(spec, filtered.pools)  # generated fleets are all CUDA
    spec = with_precision(spec, precision)
    fleet = build_fleet(spec, snap, pools, None)
    degrees, _, _ = enumerate_degrees(spec, fleet.n_devices, fleet.max_node_devices)
    return fleet, [build_problem(fleet, d) for d in degrees]


@FAST
@given(snap=snapshots(), spec=jobs(with_qos=False), pick=st.randoms(use_true_random=False))
# dp = 2 over two twin clusters: the search once priced their fabric, the runtime's ring the local link.
@example(snap=_twin_clusters(), spec=_small_sync_job(), pick=random.Random(0))
# pp = 2 under GPipe: the search once priced the pipeline as 1F1B runs it.
@example(snap=_one_two_gpu_node(), spec=_small_sync_job({"pp_schedule": "gpipe"}), pick=random.Random(0))
def test_estimator_agrees_with_the_search_objective(snap, spec, pick) -> None:
    _, problems = _problems(spec, snap)
    for pr in problems[:6]:
        sols = list(all_solutions(pr))
        for sol in pick.sample(sols, min(3, len(sols))):
            sc = evaluate(pr, sol)
            if sc is None:
                continue
            est = build_option(pr, sol).estimates
            assert abs(est.duration_s - sc.duration_s) <= 1e-9 * sc.duration_s
            assert abs(est.cost.total - sc.cost) <= 1e-9 * sc.cost + 1e-12


@FAST
@given(snap=snapshots(), spec=jobs(with_qos=False))
def test_lower_bounds_never_exceed_the_best_placement(snap, spec) -> None:
    fleet, problems = _problems(spec, snap)
    if fleet is None:
        return
    verdicts, bounds = screen(fleet, [pr.deg for pr in problems], pinned_zero=True)
    screened = {s.deg: s for s in verdicts}
    for pr in problems:
        scores = [s for s in (evaluate(pr, sol) for sol in all_solutions(pr)) if s is not None]
        lb = lower_bounds(pr)
        if screened[pr.deg].status == "ok":  # one formula, vectorised over dp or not
            assert bounds.full(pr.deg) == pytest.approx(lb, rel=1e-9)
            quick = screened[pr.deg].lb
            assert quick[0] <= lb[0] * (1 + 1e-9) and quick[1] <= lb[1] * (1 + 1e-9)
        if scores:
            assert lb[0] <= min(s.duration_s for s in scores) * (1 + 1e-9)
            assert lb[1] <= min(s.cost for s in scores) * (1 + 1e-9) + 1e-12


@FAST
@given(snap=snapshots(max_clusters=4), spec=jobs(with_qos=False))
def test_milp_is_exact_for_its_candidate(snap, spec) -> None:
    _, problems = _problems(spec, snap)
    for pr in problems[:8]:
        scores = [s for s in (evaluate(pr, sol) for sol in all_solutions(pr)) if s is not None]
        for objective, key in (("cost", lambda s: s.cost), ("time", lambda s: s.duration_s)):
            sol = solve(pr, objective)
            if not scores:
                assert sol is None or evaluate(pr, sol) is None
                continue
            best = min(key(s) for s in scores)
            assert sol is not None
            got = evaluate(pr, sol)
            assert got is not None and key(got) <= best * (1 + 1e-3) + 1e-12


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(snap=snapshots(), spec=jobs())
def test_best_option_within_one_percent_of_exhaustive(snap, spec) -> None:
    ref = exhaustive_best(spec, snap)
    try:
        options = plan(spec, snap)
    except NoFeasiblePlan:
        assert ref is None, "exhaustive search found a plan the planner missed"
        return
    assert ref is not None, "the planner returned a plan exhaustive search did not find"
    got, want = objective_key(spec, options[0])[0], objective_key(spec, ref)[0]
    assert got <= want * 1.01 + 1e-12
    assert got >= want * 0.99 - 1e-12
