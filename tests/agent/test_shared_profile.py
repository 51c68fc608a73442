"""The host's shared reference figures: taken only when fresh, alike, and this user's alone."""

from __future__ import annotations

import os
from pathlib import Path

from agent.shared_profile import alike_key, load_shared, shared_path, store_shared
from contracts.registration import NodeProfile, StepRate

RATE = {
    "tflops": 0.05,
    "micro_batch_s": 0.003,
    "step_s": 0.002,
    "optimizer_s_per_mparam": 0.0016,
    "data_s_per_mtoken": 6.9,
    "checkpoint_s_per_mparam": 0.06,
}
PROFILE = NodeProfile(
    startup_s=3.0, teardown_s=0.2, physical_cores=2, rates=(StepRate(precision="fp32", **RATE),)
)


def test_fresh_alike_figures_are_taken_and_others_are_not(tmp_path: Path) -> None:
    path = shared_path(tmp_path / "host.lock")
    key = alike_key("cpu", "cpu", 2)
    assert load_shared(path, key, 900) is None  # nothing measured yet
    store_shared(path, key, PROFILE, now=1000.0)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    figures, age = load_shared(path, key, 900, now=1060.0) or ({}, -1)
    assert figures == PROFILE.as_dict() and age == 60
    assert load_shared(path, key, 900, now=2000.0) is None  # stale
    assert load_shared(path, key, 0, now=1060.0) is None  # sharing off
    assert load_shared(path, key, 900, now=900.0) is None  # from the future: a clock step
    # Another device model, core count or kind is another key.
    others = {alike_key("cpu", "cpu", 4), alike_key("cuda", "NVIDIA H200", 2), alike_key("cuda", "A100", 2)}
    assert len({key, *others}) == 4
    assert load_shared(path, alike_key("cpu", "cpu", 4), 900, now=1060.0) is None


def test_figures_others_may_write_are_not_trusted(tmp_path: Path) -> None:
    path = shared_path(tmp_path / "host.lock")
    key = alike_key("cpu", "cpu", 2)
    store_shared(path, key, PROFILE, now=1000.0)
    os.chmod(path, 0o666)
    assert load_shared(path, key, 900, now=1001.0) is None
    os.chmod(path, 0o600)
    path.write_text("{not json")
    assert load_shared(path, key, 900, now=1001.0) is None
    store_shared(path, key, PROFILE, now=1000.0)  # a broken file is replaced whole
    assert load_shared(path, key, 900, now=1001.0) is not None
