"""The agent's registration measurement, for real: the reference worker under torchrun, as jobs run."""

from __future__ import annotations

from pathlib import Path

from agent.profile import measure_profile
from contracts.registration import profile_problems


def test_the_reference_worker_measures_start_up_teardown_and_each_precision(tmp_path: Path) -> None:
    lock = tmp_path / "host.lock"  # this test's own host: no other agent's figures to take
    profile = measure_profile("cpu", tmp_path / "reference", lock_path=lock)
    assert profile is not None, (tmp_path / "reference" / "reference-step.log").read_text()[-2000:]
    assert profile_problems(profile) == []
    # Start-up covers at least `import torch` in a fresh interpreter; the cores are this host's.
    assert profile.startup_s > 0.5 and profile.teardown_s >= 0 and profile.physical_cores >= 1
    assert profile.host_load_factor >= 1.0
    # The launcher (torchrun, its own `import torch`) measured apart: part of the start-up.
    assert 0.1 < profile.launcher_s < profile.startup_s
    rates = {r.precision: r for r in profile.rates}
    assert set(rates) == {"fp32", "bf16"}
    for r in rates.values():
        # A real GPT step on one CPU thread: well under a TFLOPS, well over a MFLOPS.
        assert 1e-6 < r.tflops < 1.0
        assert r.optimizer_s_per_mparam > 0 and r.data_s_per_mtoken > 0 and r.checkpoint_s_per_mparam > 0
    # The all-reduce between two of the host's CPU ranks, timed by the reference worker's forks.
    assert 0 < profile.collective_call_s < 1.0 and profile.collective_gbps > 0
    assert profile.collective_wait_s >= 0

    # An alike agent of the same host takes these figures instead of launching the worker again,
    # and still settles in its own turn; with sharing off it measures.
    settled: list[bool] = []
    again = measure_profile("cpu", tmp_path / "second", lock_path=lock, then=lambda: settled.append(True))
    assert again == profile and settled == [True]
    assert not (tmp_path / "second" / "reference-step.log").exists()
