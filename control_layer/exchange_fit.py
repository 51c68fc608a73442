"""The fixed and the per-parameter cost of a cross-region exchange, learned apart. Pure.

A blocking exchange's wait beyond its regional reduce, its bytes and its latency, per idle core,
is y = k·c + N·p: k calls one after another at c seconds each (framing, auth, thread hand-offs)
and the leader's work on the model's N parameters at p seconds each (flattening, the codec, the
mean, the broadcast inside the node). Exchanges of one size cannot tell c from p; exchanges of
different payloads can. Each region pair keeps exponentially decayed sums of the least-squares
normal equations (each run's weight falls by ``KEEP`` per later run, so recent runs weigh more;
slower than a single factor's move, since the fit needs runs of several sizes), and the fit is
the least-squares (c, p) >= 0, pulled toward the defaults by a ridge worth a hundredth of one
typical run, so that a single size still gives an answer (it then splits the residual between
the two terms) and several sizes decide it.

Parameters are counted in millions and p in seconds per million parameters, so the sums stay
well-conditioned.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

STATS = ("w", "kk", "kn", "nn", "ky", "ny")
RIDGE = 0.01  # the prior's weight, in typical runs: enough to decide a single size's split
KEEP = 0.75  # weight left to a run's sample per later run on the same pair (about four runs count)
SECONDS_RANGE = (-60.0, 60.0)  # one exchange's wait beyond its transfer, per idle core
COST_RANGE = (0.0, 60.0)  # c in seconds per call, p in seconds per million parameters


@dataclass(frozen=True)
class Sample:
    """One run's blocking exchanges on one region pair: calls, parameters, seconds beyond the transfer."""

    rounds: float
    mparams: float
    seconds: float


def _clamp(x: float, bounds: tuple[float, float]) -> float:
    return min(max(x, bounds[0]), bounds[1])


def accumulate(sums: Mapping[str, float], sample: Sample, keep: float = KEEP) -> dict[str, float]:
    """The sums after decaying the old ones by ``keep`` (0 < keep <= 1) and adding ``sample``."""
    k, n = sample.rounds, sample.mparams
    y = _clamp(sample.seconds, SECONDS_RANGE)
    out = {s: keep * float(sums.get(s, 0.0)) for s in STATS}
    out["w"] += 1.0
    out["kk"] += k * k
    out["kn"] += k * n
    out["nn"] += n * n
    out["ky"] += k * y
    out["ny"] += n * y
    return out


def fit(
    sums: Mapping[str, float], prior_c: float, prior_p: float, ridge: float = RIDGE
) -> tuple[float, float]:
    """(c seconds per call, p seconds per million parameters) minimising, over the decayed samples,
    Σ w (y − k·c − N·p)² + ridge·(mean k²·(c − prior_c)² + mean N²·(p − prior_p)²), with c, p >= 0
    (the means weighted as the sums are). The prior alone where the sums hold nothing."""
    w = float(sums.get("w", 0.0))
    kk, nn = max(0.0, float(sums.get("kk", 0.0))), max(0.0, float(sums.get("nn", 0.0)))
    kn, ky, ny = (float(sums.get(s, 0.0)) for s in ("kn", "ky", "ny"))
    r = ridge / w if w > 0 else 0.0
    a11, a22 = kk * (1.0 + r), nn * (1.0 + r)
    b1, b2 = ky + r * kk * prior_c, ny + r * nn * prior_p
    det = a11 * a22 - kn * kn
    c, p = prior_c, prior_p
    if det > 1e-12 * max(a11 * a22, 1e-300):
        c, p = (b1 * a22 - kn * b2) / det, (a11 * b2 - kn * b1) / det
    elif a11 > 0:
        c = (b1 - kn * prior_p) / a11
    elif a22 > 0:
        p = (b2 - kn * prior_c) / a22
    # Neither cost can be negative: with one at zero, the other is the one-variable fit.
    if c < 0:
        c, p = 0.0, (b2 / a22 if a22 > 0 else prior_p)
    if p < 0:
        p, c = 0.0, (b1 / a11 if a11 > 0 else prior_c)
    c, p = max(0.0, c), max(0.0, p)
    if not (math.isfinite(c) and math.isfinite(p)):
        return prior_c, prior_p
    return _clamp(c, COST_RANGE), _clamp(p, COST_RANGE)
