"""The exchange's fixed, per-call and per-parameter costs, fitted apart from samples of different shapes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from control_layer import exchange_fit as xf

# cost_model's defaults: seconds per exchange, per call, per million parameters.
PRIOR = xf.Costs(0.010, 0.003, 0.016)

# `sync` exchanges on loopback on the reference box (BENCHMARKS.md at dabf7f7, quote accuracy): calls,
# millions of parameters, seconds beyond the transfer per idle core. Two regions make one call each; the
# three-region ring of the s model four.
MEASURED = [(1, 0.11, 0.0148), (1, 0.47, 0.0205), (1, 0.86, 0.0268), (1, 3.4, 0.0675), (4, 0.47, 0.033)]


def _fold(samples: list[xf.Sample], keep: float = xf.KEEP) -> dict[str, float]:
    sums: dict[str, float] = {}
    for s in samples:
        sums = xf.accumulate(sums, s, keep)
    return sums


def test_real_exchanges_of_several_shapes_give_the_three_parts() -> None:
    got = xf.fit(_fold([xf.Sample(k, n, y) for k, n, y in MEASURED]), PRIOR)
    assert got.per_mparam == pytest.approx(0.016, abs=0.002)
    assert got.call == pytest.approx(0.0055, abs=0.002)
    assert got.fixed == pytest.approx(0.0075, abs=0.002)
    # The smallest model is priced at its own exchange, not at the largest's per call.
    assert got.seconds(1, 0.11) == pytest.approx(0.0148, rel=0.15)


def test_the_fixed_part_keeps_a_small_model_priced_after_a_large_one() -> None:
    # A large model's exchange and a long ring's: without a fixed term the call would carry both.
    got = xf.fit(_fold([xf.Sample(4, 0.47, 0.033), xf.Sample(1, 3.4, 0.0675)]), PRIOR)
    assert got.seconds(1, 0.11) == pytest.approx(0.0148, rel=0.25)


def test_one_shape_splits_the_miss_and_the_next_shapes_decide() -> None:
    one = xf.fit(_fold([xf.Sample(1, 3.4, 0.0675)]), PRIOR)
    assert one.seconds(1, 3.4) == pytest.approx(0.0675, rel=0.05)
    # Every part takes a share of what the prior missed.
    assert one.fixed > PRIOR.fixed and one.call > PRIOR.call and one.per_mparam > PRIOR.per_mparam


def test_no_samples_is_the_prior_and_older_runs_fade() -> None:
    assert xf.fit({}, PRIOR) == PRIOR
    sums = _fold([xf.Sample(1, 1.0, 0.05)], keep=0.5)
    again = xf.accumulate(sums, xf.Sample(1, 1.0, 0.05), keep=0.5)
    assert again["w"] == pytest.approx(1.5) and again["nn"] == pytest.approx(1.5)
    # A host that became twice as slow: recent runs pull the fit toward the new figures.
    shapes = [(1, 0.5), (4, 2.0), (1, 2.0)]
    old = [xf.Sample(k, n, 0.01 + 0.002 * k + 0.01 * n) for k, n in shapes] * 3
    new = [xf.Sample(k, n, 0.02 + 0.004 * k + 0.02 * n) for k, n in shapes] * 3
    got = xf.fit(_fold(old + new), PRIOR)
    assert 0.015 < got.per_mparam <= 0.0205 and got.seconds(1, 1.0) > 0.035


def test_sums_of_the_older_two_term_layout_start_again() -> None:
    older = {"w": 3.0, "kk": 3.0, "kn": 1.0, "nn": 2.0, "ky": 0.1, "ny": 0.2}
    assert xf.fit(older, PRIOR) == PRIOR
    assert xf.accumulate(older, xf.Sample(1, 1.0, 0.05))["w"] == 1.0


def test_a_negative_part_is_refitted_as_zero() -> None:
    # Waits that shrink with the model (noise) cannot make the per-parameter cost negative.
    got = xf.fit(_fold([xf.Sample(1, 0.1, 0.05), xf.Sample(1, 3.0, 0.01)]), PRIOR)
    assert got.per_mparam == 0.0 and got.fixed + got.call > 0


samples = st.lists(
    st.builds(
        xf.Sample,
        rounds=st.integers(1, 10),
        mparams=st.floats(0.001, 1e4),
        seconds=st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False),
    ),
    min_size=0,
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(samples)
def test_any_samples_give_bounded_non_negative_costs(found: list[xf.Sample]) -> None:
    got = xf.fit(_fold(found), PRIOR)
    for x in (got.fixed, got.call, got.per_mparam):
        assert math.isfinite(x) and xf.COST_RANGE[0] <= x <= xf.COST_RANGE[1]


shapes = st.lists(st.tuples(st.sampled_from([1, 2, 4, 6]), st.floats(0.01, 50.0)), min_size=6, max_size=20)
costs = st.tuples(st.floats(0.0, 0.5), st.floats(0.0, 0.5), st.floats(0.0, 0.5))


def _conditioned(recent: list[tuple[int, float]]) -> float:
    """The smallest singular value of the recent design (1, k, N), each column scaled to unit size:
    how far the recent shapes are from leaving one direction of (e, c, p) open."""
    x = np.array([[1.0, k, n] for k, n in recent])
    x = x / np.linalg.norm(x, axis=0)
    return float(np.linalg.svd(x, compute_uv=False)[-1])


@settings(max_examples=200, deadline=None)
@given(costs, shapes)
def test_exact_samples_of_varied_shapes_recover_the_three_parts(
    truth: tuple[float, float, float], found_shapes: list[tuple[int, float]]
) -> None:
    # Recent shapes that vary in both ring length and size determine e, c and p: without the
    # ridge the fit gives them back exactly.
    assume(_conditioned(found_shapes[-6:]) > 0.05)
    e, c, p = truth
    found = [xf.Sample(k, n, e + c * k + p * n) for k, n in found_shapes]
    got = xf.fit(_fold(found), PRIOR, ridge=0.0)
    assert got.fixed == pytest.approx(e, abs=1e-6)
    assert got.call == pytest.approx(c, abs=1e-6)
    assert got.per_mparam == pytest.approx(p, abs=1e-7)


def _objective(samples: list[xf.Sample], prior: xf.Costs, beta: tuple[float, float, float]) -> float:
    """The fit's documented objective, computed from the samples themselves: the decayed squared
    misses plus the ridge's pull toward the prior (per term, a hundredth of the mean x_j^2)."""
    n = len(samples)
    w = [xf.KEEP ** (n - 1 - i) for i in range(n)]
    xs = [(1.0, s.rounds, s.mparams) for s in samples]
    miss = sum(
        wi * (s.seconds - sum(b * x for b, x in zip(beta, xi, strict=True))) ** 2
        for wi, s, xi in zip(w, samples, xs, strict=True)
    )
    total = sum(w)
    lam = [xf.RIDGE / total * sum(wi * xi[j] ** 2 for wi, xi in zip(w, xs, strict=True)) for j in range(3)]
    p0 = (prior.fixed, prior.call, prior.per_mparam)
    return miss + sum(lam[j] * (beta[j] - p0[j]) ** 2 for j in range(3))


@settings(max_examples=200, deadline=None)
@given(costs, shapes, st.lists(costs, min_size=1, max_size=5))
def test_with_the_ridge_no_non_negative_costs_beat_the_fit(
    truth: tuple[float, float, float],
    found_shapes: list[tuple[int, float]],
    others: list[tuple[float, float, float]],
) -> None:
    # The fit is the optimum of its objective over e, c, p >= 0: neither the truth, nor the prior,
    # nor any other non-negative costs do better. So its decayed squared misses stay within the
    # ridge's charge for the truth, however little the recent shapes vary.
    e, c, p = truth
    found = [xf.Sample(k, n, e + c * k + p * n) for k, n in found_shapes]
    got = xf.fit(_fold(found), PRIOR)
    best = _objective(found, PRIOR, (got.fixed, got.call, got.per_mparam))
    prior = (PRIOR.fixed, PRIOR.call, PRIOR.per_mparam)
    for q in [truth, prior, *others]:
        assert best <= _objective(found, PRIOR, q) * (1 + 1e-9) + 1e-12, (q, got)
