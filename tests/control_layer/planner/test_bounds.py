"""The lower bounds' counting helpers against direct enumeration."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from control_layer.planner.bounds import fewest_members, fewest_members_by_region


def _by_hand(cap: list[int], count: list[int], usable: list[bool], dp: int) -> float:
    """Take the largest members first until they hold dp replicas."""
    members = sorted(
        (c for c, n, ok in zip(cap, count, usable, strict=True) if ok for _ in range(n)), reverse=True
    )
    held = 0
    for taken, c in enumerate(members, start=1):
        held += c
        if held >= dp:
            return float(taken)
    return math.inf


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    units=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 4)), min_size=1, max_size=8),
    rows=st.lists(
        st.tuples(st.integers(1, 40), st.lists(st.booleans(), min_size=8, max_size=8)), min_size=1, max_size=4
    ),
)
def test_fewest_members_is_the_fewest_largest_first(units, rows) -> None:
    cap = np.array([c for c, _ in units])
    count = np.array([n for _, n in units])
    usable = np.array([mask[: len(units)] for _, mask in rows])
    dp = np.array([d for d, _ in rows])
    got = fewest_members(cap, usable, count, dp)
    for i, (d, mask) in enumerate(rows):
        assert got[i] == _by_hand(cap.tolist(), count.tolist(), mask[: len(units)], d)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    units=st.lists(
        st.tuples(st.integers(0, 6), st.integers(0, 4), st.integers(0, 2)), min_size=1, max_size=8
    ),
    rows=st.lists(
        st.tuples(st.integers(1, 40), st.lists(st.booleans(), min_size=8, max_size=8)), min_size=1, max_size=4
    ),
)
def test_fewest_members_by_region_fills_each_region_alone(units, rows) -> None:
    cap = np.array([c for c, _, _ in units])
    count = np.array([n for _, n, _ in units])
    region = np.array([r for _, _, r in units])
    usable = np.array([mask[: len(units)] for _, mask in rows])
    dp = np.array([d for d, _ in rows])
    got = fewest_members_by_region(cap, usable, count, dp, region, 3)
    for i, (d, mask) in enumerate(rows):
        for r in range(3):
            here = [j for j in range(len(units)) if region[j] == r]
            want = _by_hand(
                [int(cap[j]) for j in here], [int(count[j]) for j in here], [mask[j] for j in here], d
            )
            assert got[i, r] == want
