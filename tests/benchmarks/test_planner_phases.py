"""planner_phases: per-phase CPU that adds up to each quote's, solves counted, the search restored."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import planner_phases  # noqa: E402

import control_layer.planner.search as search  # noqa: E402
from control_layer.planner.screen import Bounds  # noqa: E402


def test_phases_add_up_and_the_search_is_put_back() -> None:
    before = {attr: getattr(owner, attr) for owner, attr in planner_phases.PHASES.values()}
    passes = {attr: getattr(search._Search, attr) for attr in planner_phases.PASSES.values()}
    rows = planner_phases.measure(clusters=10, quotes=4, seed=1)
    assert [r["quote"] for r in rows] == [0, 1, 2, 3]
    for r in rows:
        phases = r["phases_ms"]
        assert set(phases) - {"other"} <= set(planner_phases.PHASES)
        # The phases and the rest make up the quote (each figure rounded to 0.1 ms).
        assert abs(sum(phases.values()) - r["cpu_ms"]) <= 0.05 * len(phases) + 1e-9
        assert all(v >= 0.0 for k, v in phases.items() if k != "other")
        if r["options"]:
            assert phases.get("screen", 0.0) > 0.0 or phases.get("spanning", 0.0) > 0.0
    # Quotes with options from the search solved candidates there, counted per pass.
    assert any(r["solved"].get("heuristic", 0) > 0 for r in rows)
    assert all(set(r["solved"]) <= {"heuristic", "front_fill", "milp"} for r in rows)
    assert {attr: getattr(owner, attr) for owner, attr in planner_phases.PHASES.values()} == before
    assert {attr: getattr(search._Search, attr) for attr in planner_phases.PASSES.values()} == passes
    assert Bounds.full is before["full"]
