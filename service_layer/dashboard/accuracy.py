"""What the dashboard shows of quotes against runs: one job's breakdown, and all jobs' accuracy. Pure.

Both read the estimate-vs-actual record each ended job keeps (``control_layer.calibration.
accuracy_record``): the estimate's parts next to what the slowest task measured.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

# (label, estimate's step part(s), the workers' measured per-step part)
STEP_ROWS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("data", ("data",), "data_s"),
    ("forward/backward", ("compute", "tp_comm", "dp_comm", "pp_bubble", "pp_comm"), "compute_s"),
    ("optimizer", ("optimizer",), "optimizer_s"),
    ("sync wait", ("wan_sync",), "sync_s"),
    ("checkpoint", ("checkpoint",), "checkpoint_s"),
)


@dataclass(frozen=True)
class Row:
    label: str
    estimated: float | None
    actual: float | None

    @property
    def error(self) -> float | None:
        """(actual − estimate) / estimate, as the calibration counts it."""
        if self.estimated is None or self.actual is None or self.estimated <= 0:
            return None
        return (self.actual - self.estimated) / self.estimated


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def _slowest(tasks: Sequence[dict[str, Any]], key: str, step: bool = False) -> float | None:
    values = [
        v for t in tasks if (v := _num((t.get("step_s") or {}).get(key) if step else t.get(key))) is not None
    ]
    return max(values) if values else None


def breakdown(accuracy: dict[str, Any] | None) -> dict[str, list[Row]] | None:
    """The run's span (start-up, steps, final sync, teardown, total) and its step (per part),
    estimated against measured; None for a job without a record."""
    if not accuracy:
        return None
    est, act = accuracy.get("estimated") or {}, accuracy.get("actual") or {}
    step = est.get("step_s") or {}
    tasks = [t for t in act.get("tasks") or [] if isinstance(t, dict)]
    steps_est = None
    if (total := _num(step.get("total"))) is not None and (n := _num(est.get("steps"))) is not None:
        steps_est = total * n
    span = [
        Row("start-up", _num(est.get("startup_s")), _slowest(tasks, "startup_s")),
        Row("training steps", steps_est, _slowest(tasks, "train_s")),
        Row("final sync", _num(est.get("final_sync_s")), _slowest(tasks, "final_sync_s")),
        Row("teardown", _num(est.get("teardown_s")), _slowest(tasks, "teardown_s")),
        Row("billed span", _num(est.get("duration_s")), _num(act.get("duration_s"))),
    ]
    per_step = [
        Row(label, sum(_num(step.get(p)) or 0.0 for p in parts), _slowest(tasks, key, step=True))
        for label, parts, key in STEP_ROWS
    ]
    per_step.append(Row("step", _num(step.get("total")), _slowest(tasks, "wall_s", step=True)))
    return {"span": span, "step": per_step}


def _quantile(xs: Sequence[float], q: float) -> float:
    ordered = sorted(xs)
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summary(records: Iterable[dict[str, Any] | None]) -> dict[str, Any]:
    """Over every job's record: how many, and the median and p90 of |error| for time and cost,
    with how many came within 10 % and 30 %."""
    errors: dict[str, list[float]] = {"time": [], "cost": []}
    for r in records:
        for kind in errors:
            value = _num(((r or {}).get("error") or {}).get(kind))
            if value is not None:
                errors[kind].append(abs(value))
    out: dict[str, Any] = {"jobs": len(errors["time"])}
    for kind, xs in errors.items():
        out[kind] = {
            "p50": statistics.median(xs) if xs else None,
            "p90": _quantile(xs, 0.9) if xs else None,
            "within_10": sum(x <= 0.10 for x in xs),
            "within_30": sum(x <= 0.30 for x in xs),
        }
    return out
