"""The fixed, the per-call and the per-parameter cost of a cross-region exchange, learned apart. Pure.

A blocking exchange's wait beyond its regional reduce, its bytes and its latency, per idle core,
is y = e + k·c + N·p: e once per exchange whatever its size or shape (the in-node gather and
broadcast loop over every parameter tensor, the fingerprints, waking the exchange's threads), k
calls one after another at c seconds each (framing, auth, thread hand-offs) and the leader's work
on the model's N parameters at p seconds each (flattening, the codec, the mean, the broadcast
inside the node). Exchanges of one shape cannot tell the terms apart; exchanges of different
payloads (N) and different ring lengths (k) can. Each region pair keeps exponentially decayed sums
of the least-squares normal equations (each run's weight falls by ``KEEP`` per later run, so
recent runs weigh more; slower than a single factor's move, since the fit needs runs of several
shapes), and the fit is the least-squares (e, c, p) >= 0, pulled toward the defaults by a ridge
worth a hundredth of one typical run, so that a single shape still gives an answer (it then splits
the residual among the terms) and several shapes decide it.

Parameters are counted in millions and p in seconds per million parameters, so the sums stay
well-conditioned.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

# Decayed sums: the weight, the regressors' (1, k, N) first and second moments, y's with them.
STATS = ("w", "k", "n", "kk", "kn", "nn", "y", "ky", "ny")
RIDGE = 0.01  # the prior's weight, in typical runs: enough to decide a single shape's split
KEEP = 0.75  # weight left to a run's sample per later run on the same pair (about four runs count)
SECONDS_RANGE = (-60.0, 60.0)  # one exchange's wait beyond its transfer, per idle core
# e in seconds per exchange, c in seconds per call, p in seconds per million parameters.
COST_RANGE = (0.0, 60.0)


@dataclass(frozen=True)
class Sample:
    """One run's blocking exchanges on one region pair: calls, parameters, seconds beyond the transfer."""

    rounds: float
    mparams: float
    seconds: float


@dataclass(frozen=True)
class Costs:
    """Seconds per exchange, per call, per million parameters (all per idle core)."""

    fixed: float
    call: float
    per_mparam: float

    def seconds(self, rounds: float, mparams: float) -> float:
        return self.fixed + rounds * self.call + mparams * self.per_mparam


def _clamp(x: float, bounds: tuple[float, float]) -> float:
    return min(max(x, bounds[0]), bounds[1])


def _complete(sums: Mapping[str, float]) -> bool:
    """Sums kept before the fixed term existed lack its moments: they cannot be extended."""
    return all(s in sums for s in STATS)


def accumulate(sums: Mapping[str, float], sample: Sample, keep: float = KEEP) -> dict[str, float]:
    """The sums after decaying the old ones by ``keep`` (0 < keep <= 1) and adding ``sample``.
    Sums of another layout (an older version's) are dropped: the fit starts again from this run."""
    k, n = sample.rounds, sample.mparams
    y = _clamp(sample.seconds, SECONDS_RANGE)
    old = sums if _complete(sums) else {}
    out = {s: keep * float(old.get(s, 0.0)) for s in STATS}
    for s, v in (("w", 1.0), ("k", k), ("n", n), ("kk", k * k), ("kn", k * n), ("nn", n * n)):
        out[s] += v
    for s, v in (("y", y), ("ky", k * y), ("ny", n * y)):
        out[s] += v
    return out


def fit(sums: Mapping[str, float], prior: Costs, ridge: float = RIDGE) -> Costs:
    """(e, c, p) minimising, over the decayed samples, Σ w (y − e − k·c − N·p)² plus the ridge
    ridge·Σ_j mean x_j²·(β_j − prior_j)² (x_j the regressor: 1, k, N; means weighted as the sums
    are), with e, c, p >= 0: the best of the non-negative solutions over every set of terms left
    free (the others at 0). The prior alone where the sums hold nothing."""
    w = float(sums.get("w", 0.0)) if _complete(sums) else 0.0
    if w <= 0:
        return prior
    g = {s: float(sums[s]) for s in STATS}
    a = np.array(
        [[g["w"], g["k"], g["n"]], [g["k"], g["kk"], g["kn"]], [g["n"], g["kn"], g["nn"]]], dtype=float
    )
    b = np.array([g["y"], g["ky"], g["ny"]], dtype=float)
    beta0 = np.array([prior.fixed, prior.call, prior.per_mparam], dtype=float)
    # The ridge's weight per term: a hundredth of one run's typical x_j², times the prior's pull.
    lam = ridge / w * np.maximum(np.diag(a), 0.0)
    a_r, b_r = a + np.diag(lam), b + lam * beta0
    best, best_obj = None, math.inf
    for free in itertools.chain.from_iterable(itertools.combinations(range(3), m) for m in (3, 2, 1, 0)):
        beta = np.zeros(3)
        if free:
            idx = list(free)
            sub = a_r[np.ix_(idx, idx)]
            if abs(np.linalg.det(sub)) <= 1e-12 * max(float(np.prod(np.diag(sub))), 1e-300):
                continue
            beta[idx] = np.linalg.solve(sub, b_r[idx])
            if np.any(beta[idx] < 0) or not np.all(np.isfinite(beta)):
                continue
        # The objective up to a constant: β'A_rβ − 2β'b_r.
        obj = float(beta @ a_r @ beta - 2.0 * beta @ b_r)
        if obj < best_obj - 1e-15:
            best, best_obj = beta, obj
    if best is None:
        return prior
    e, c, p = (_clamp(float(x), COST_RANGE) for x in best)
    return Costs(e, c, p)
