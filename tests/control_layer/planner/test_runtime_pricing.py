"""The runtime settings' rules applied to arrays of placements (what the search ranks by) agree with
the same rules applied to one placement (what an option's settings and quote carry)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from control_layer.planner.checkpoint_policy import checkpoint_every, checkpoint_intervals
from control_layer.planner.sync_settings import overlap_delay, sync_settings

FAST = settings(max_examples=60, deadline=None, derandomize=True)
steps_s = st.floats(min_value=0.0, max_value=1e3, allow_nan=False)


@FAST
@given(
    step=st.lists(steps_s, min_size=1, max_size=8),
    write_s=st.floats(min_value=0.0, max_value=1e3, allow_nan=False),
    steps=st.integers(min_value=1, max_value=100_000),
)
def test_checkpoint_intervals_match_the_scalar_policy(step: list[float], write_s: float, steps: int) -> None:
    got = checkpoint_intervals(np.array(step), write_s, steps)
    assert got.tolist() == [checkpoint_every(s, write_s, steps) for s in step]


@FAST
@given(
    every=st.sampled_from([2, 8, 10, 50, 100, 500]),
    payload=st.floats(min_value=1e3, max_value=1e10),
    rows=st.lists(
        st.tuples(
            st.integers(min_value=2, max_value=64),  # participants
            st.sampled_from([0.0, 1e8, 1e9, 1e10]),  # slowest link, bits/s (0: unknown)
            st.sampled_from([0.0, 0.01, 0.2]),  # latency s
            steps_s,
        ),
        min_size=1,
        max_size=8,
    ),
)
def test_overlap_delay_over_placements_matches_each_options_settings(every, payload, rows) -> None:
    n, bw, lat, step = (np.array(c) for c in zip(*rows, strict=True))
    one = [
        sync_settings(
            mode="diloco",
            every=every,
            n_regions=int(k),
            payload=payload,
            step_s=float(s),
            bandwidth_bps=float(b) or None,
            latency_s=float(la),
        )
        for k, b, la, s in rows
    ]
    fragments = {s.fragments for s in one}
    assert len(fragments) == 1  # the spec alone fixes the fragments
    f = fragments.pop()
    got = overlap_delay(every // f, payload / f, n, bw, lat, step)
    assert got.tolist() == [s.overlap_steps for s in one]
