"""The regions' lag at an exchange made every H steps, as a part that scales with the round's
steps and a fixed part per round, learned apart. Pure.

At an exchange every H > 1 steps the first region waits for the last. Part of that lag grows with
the H local steps of T_local seconds the regions ran apart (one runs a steady few per cent slower):
δ·H·T_local. Part does not: the OS waking a region's threads late, a peer's barrier answer queued
behind training on a shared host, each a fixed spell per round per idle core: κ·σ at host share σ.
One fraction of the round alone (κ = 0) learned on a small model's short rounds, where the fixed
spell is most of the lag, overprices a large model's long rounds, and the other way round. So per
region pair the lag per round is y = δ·x + κ·σ (x = H·T_local), fitted over the runs' samples as
``exchange_fit`` fits the exchange's own costs: exponentially decayed least-squares sums (recent
runs weigh more) and a ridge worth a hundredth of a typical run toward (0, 0), so a single shape
splits its lag between the two terms (and prices that shape as it was seen) and runs of different
round lengths decide the split.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from control_layer.exchange_fit import KEEP, RIDGE

STATS = ("w", "xx", "xs", "ss", "xy", "sy")
LAG_RANGE = (0.0, 600.0)  # one round's lag, seconds
DRIFT_RANGE = (0.0, 10.0)  # δ: the lag per second of the round's local steps
FIXED_RANGE = (0.0, 60.0)  # κ: seconds per round per idle core


@dataclass(frozen=True)
class Sample:
    """One run's lag per round on a region pair: its local steps' seconds, host share, lag seconds."""

    round_s: float
    share: float
    lag_s: float


@dataclass(frozen=True)
class Drift:
    fraction: float  # δ
    fixed_s: float  # κ, per idle core

    def lag_s(self, round_s: float, share: float) -> float:
        return self.fraction * round_s + self.fixed_s * max(1.0, share)


def _clamp(x: float, bounds: tuple[float, float]) -> float:
    return min(max(x, bounds[0]), bounds[1])


def accumulate(sums: Mapping[str, float], sample: Sample, keep: float = KEEP) -> dict[str, float]:
    """The sums after decaying the old ones by ``keep`` and adding ``sample``."""
    x, s = max(0.0, sample.round_s), max(1.0, sample.share)
    y = _clamp(sample.lag_s, LAG_RANGE)
    old = sums if all(k in sums for k in STATS) else {}
    out = {k: keep * float(old.get(k, 0.0)) for k in STATS}
    for k, v in (("w", 1.0), ("xx", x * x), ("xs", x * s), ("ss", s * s), ("xy", x * y), ("sy", s * y)):
        out[k] += v
    return out


def fit(sums: Mapping[str, float], ridge: float = RIDGE) -> Drift:
    """(δ, κ) >= 0 minimising Σ w (y − δ·x − κ·σ)² + ridge·Σ_j mean x_j²·β_j²: the best of the
    non-negative solutions with both, either or neither term free. (0, 0) where the sums are empty."""
    w = float(sums.get("w", 0.0)) if all(k in sums for k in STATS) else 0.0
    if w <= 0:
        return Drift(0.0, 0.0)
    a = np.array([[sums["xx"], sums["xs"]], [sums["xs"], sums["ss"]]], dtype=float)
    b = np.array([sums["xy"], sums["sy"]], dtype=float)
    a_r = a + np.diag(ridge / w * np.maximum(np.diag(a), 0.0))
    best, best_obj = np.zeros(2), 0.0  # neither term: objective 0 (up to the constant Σ w y²)
    for free in ((0, 1), (0,), (1,)):
        idx = list(free)
        sub = a_r[np.ix_(idx, idx)]
        if abs(np.linalg.det(sub)) <= 1e-12 * max(float(np.prod(np.diag(sub))), 1e-300):
            continue
        beta = np.zeros(2)
        beta[idx] = np.linalg.solve(sub, b[idx])
        if np.any(beta < 0) or not np.all(np.isfinite(beta)):
            continue
        obj = float(beta @ a_r @ beta - 2.0 * beta @ b)
        if obj < best_obj - 1e-15:
            best, best_obj = beta, obj
    return Drift(_clamp(float(best[0]), DRIFT_RANGE), _clamp(float(best[1]), FIXED_RANGE))
