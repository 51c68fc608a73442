"""sync_quality's summary over workloads: the worst ratio over every workload run, side by side
or in one process, and a workload without the row left out rather than counted as met."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from sync_quality import combine, worst  # noqa: E402


def _rows(fp32: float, int8: float | None) -> dict[str, dict[str, float]]:
    rows = {"diloco H20 fp32": {"loss": fp32}}
    if int8 is not None:
        rows["diloco H20 int8 overlap"] = {"loss": int8}
    return rows


def test_the_worst_ratio_is_over_every_workload_that_ran_the_row() -> None:
    results = {"a": _rows(2.0, 2.004), "b": _rows(3.0, 3.03), "c": _rows(1.0, None)}
    assert worst(results, "diloco H20 int8 overlap") == 3.03 / 3.0
    assert worst(results, "diloco H20 auto") is None


def test_runs_side_by_side_combine_into_one_summary() -> None:
    def part(wl: str, int8: float | None, auto: float | None) -> dict:
        per = {wl: {"int8_overlap_h20_loss_ratio": int8, "auto_choice_loss_ratio": auto}}
        return {"steps": 300, "per_workload": per}

    out = combine([part("a", 1.002, 1.002), part("b", 1.009, 1.0), part("c", None, 1.001)])
    assert set(out["per_workload"]) == {"a", "b", "c"} and out["steps"] == 300
    assert out["worst_workload_int8_overlap_h20_loss_ratio"] == 1.009
    assert out["worst_workload_auto_choice_loss_ratio"] == 1.002
