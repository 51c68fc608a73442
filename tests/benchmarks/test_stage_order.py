"""The planner's spanning options on generated fleets of unequal ports (``benchmarks/stage_order``):
where the search reorders a replica's stages, the independent simulator finds it no slower."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import stage_order  # noqa: E402


def test_searched_orders_of_the_planners_options_simulate_no_slower() -> None:
    figures = stage_order.run(8, 0)
    assert figures["reordered"] >= 3, figures
    assert figures["sim_slower"] == 0 and figures["sim_faster"] >= figures["reordered"] - 1, figures
    assert figures["est_err_p90_searched"] <= 0.10, figures
