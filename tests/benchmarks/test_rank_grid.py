"""The pure parts of ``benchmarks/estimator_rank.py``: Spearman's correlation against scipy's, the
grid of placements (every assignment of nodes to replica and stage, once up to the replicas'
order), the mesh lab's checks of its input, and the planner pricing every placement of the grid
from a snapshot of measured links."""

from __future__ import annotations

import itertools
import random

import pytest
from scipy.stats import spearmanr

from benchmarks._rank_grid import (
    NODES,
    RATES_MBIT,
    SIM_INPUTS,
    estimated_step_s,
    grid,
    job_spec,
    option,
    snapshot,
    spearman,
    steady_figures,
    tasks,
)
from benchmarks.meshlab import MeshLab
from benchmarks.sim import simulate


@pytest.mark.parametrize("seed", range(20))
def test_spearman_matches_scipy_with_and_without_ties(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(2, 30)
    x = [float(rng.randint(0, 6 if seed % 2 else 10_000)) for _ in range(n)]  # odd seeds: many ties
    y = [float(rng.randint(0, 6 if seed % 3 else 10_000)) for _ in range(n)]
    if len(set(x)) < 2 or len(set(y)) < 2:
        assert spearman(x, y) != spearman(x, y)  # a constant sequence has no ranking: NaN
        return
    assert spearman(x, y) == pytest.approx(spearmanr(x, y).statistic, abs=1e-12)


def test_spearman_extremes_and_bad_input() -> None:
    assert spearman([1.0, 2.0, 3.0], [10.0, 20.0, 30.0]) == pytest.approx(1.0)
    assert spearman([1.0, 2.0, 3.0], [3.0, 2.0, 1.0]) == pytest.approx(-1.0)
    with pytest.raises(ValueError):
        spearman([1.0], [1.0])
    with pytest.raises(ValueError):
        spearman([1.0, 2.0], [1.0, 2.0, 3.0])


def test_grid_holds_every_assignment_once_up_to_the_replicas_order() -> None:
    placements = grid()
    assert len(placements) == 12
    seen = set()
    for perm in itertools.permutations(range(NODES)):
        reps = (perm[:2], perm[2:])
        seen.add(frozenset(reps))
    assert {frozenset(p.replicas) for p in placements} == seen
    # Every node holds one stage of one replica in each placement.
    for p in placements:
        assert sorted(n for rep in p.replicas for n in rep) == list(range(NODES))
    # No two placements put the same links under the pipelines and under each stage's ring.
    roles = {(tuple(sorted(p.pipeline_links())), tuple(p.ring_links())) for p in placements}
    assert len(roles) == len(placements)
    with pytest.raises(ValueError):
        grid(nodes=5)


def test_tasks_follow_the_placement() -> None:
    p = grid()[3]
    ts = tasks(p)
    assert len(ts) == NODES
    for t in ts:
        assert t.node == f"node{p.replicas[t.dp_rank][t.pp_stage]}"
        assert t.region == f"n{p.replicas[t.dp_rank][t.pp_stage]}"


def test_mesh_lab_refuses_incomplete_or_unbounded_rates() -> None:
    with pytest.raises(ValueError, match="every pair"):
        MeshLab(3, {(0, 1): 5.0, (0, 2): 5.0}, prefix="t", subnet="10.0.0")
    with pytest.raises(ValueError, match="0.1 to 10,000"):
        MeshLab(2, {(0, 1): 0.0}, prefix="t", subnet="10.0.0")
    with pytest.raises(ValueError, match="2 to 16"):
        MeshLab(1, {}, prefix="t", subnet="10.0.0")
    with pytest.raises(ValueError, match="8 characters"):
        MeshLab(2, {(0, 1): 5.0}, prefix="toolongprefix", subnet="10.0.0")


def test_every_placement_is_priced_and_slower_links_price_slower() -> None:
    """The planner prices each placement from the snapshot's links; giving every link twice the
    bandwidth makes every placement's step cheaper, and the simulator prices them too."""
    spec = job_spec(10)
    links = {(a, b): r for (x, y), r in RATES_MBIT.items() for a, b in ((x, y), (y, x))}
    slow = snapshot(links, None, 0.02)
    fast = snapshot({k: 2 * v for k, v in links.items()}, None, 0.02)
    for p in grid():
        o = option(spec, slow, p)
        assert {(t.dp_rank, t.pp_stage, t.node) for t in o.tasks} == {
            (t.dp_rank, t.pp_stage, t.node) for t in tasks(p)
        }
        assert estimated_step_s(option(spec, fast, p)) < estimated_step_s(o)
        assert simulate(spec, o, slow, efficiency=1.0, **SIM_INPUTS).step_s > 0
    with pytest.raises(ValueError):
        job_spec(1)


def test_steady_figures_take_the_slower_group_after_start_up_up_to_the_step_asked() -> None:
    def line(step: int, wall: float, compute: float, blocked: float) -> dict:
        return {"step": step, "wall_s": wall, "compute_s": compute, "sync": {"blocked_s": blocked}}

    a = [line(1, 9.0, 1, 5), line(2, 8.0, 1, 5), line(3, 2.0, 1.0, 0.5), line(4, 3.0, 1.1, 0.7)]
    a += [line(5, 2.5, 1.2, 0.4), line(6, 30.0, 1, 0)]
    b = [line(3, 2.2, 0.9, 0.9), line(4, 2.8, 1.0, 0.2), line(5, 2.4, 1.0, 0.1), {"event": "no step"}]
    got = steady_figures([a, b], skip=2, upto=5)
    # steps 3-5 (1-2 start-up, 6 the last): the slower group's walls 2.2, 3.0, 2.5
    assert got["step_s"] == pytest.approx(2.5)
    assert got["compute_s"] == pytest.approx(1.1)  # 0.9 (b), 1.1 (a), 1.2 (a)
    assert got["sync_blocked_s"] == pytest.approx(0.7)  # 0.9, 0.7, 0.4
    assert got["steps"] == 3
    with pytest.raises(ValueError):
        steady_figures([a[:2]], skip=2, upto=5)
