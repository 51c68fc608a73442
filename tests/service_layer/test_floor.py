"""The entropy floor is what workers report; the server never computes it (no torch on requests)."""

from __future__ import annotations

import math
import subprocess
import sys

from service_layer.floor import entropy_floor, uniform_loss


def test_floor_is_the_first_reported_value() -> None:
    job_result = {"loss_end": 2.0}  # aggregated before any task reported a floor
    task_result = {"entropy_floor": 1.5, "final_loss": 1.6}
    last_metrics = {"step": 7, "loss": 1.9, "entropy_floor": 1.25}
    assert entropy_floor(job_result, task_result, last_metrics) == 1.5
    assert entropy_floor(None, {"step": 1}, last_metrics) == 1.25  # running: from the step metrics


def test_unknown_floor_is_none_not_a_guess() -> None:
    assert entropy_floor() is None
    assert entropy_floor(None, {}, {"entropy_floor": None}) is None  # BYO or token data: no floor
    assert entropy_floor({"entropy_floor": True}, {"entropy_floor": "1.2"}) is None
    assert entropy_floor({"entropy_floor": math.nan}, {"entropy_floor": 2}) == 2.0


def test_uniform_loss_is_ln_vocab() -> None:
    assert uniform_loss({"model": {"vocab": 64}}) == math.log(64)
    assert uniform_loss({"model": {}}) is None


def test_serving_requests_imports_neither_torch_nor_the_worker() -> None:
    code = (
        "import sys, service_layer.app, service_layer.queries, service_layer.floor\n"
        "print(sorted(m for m in ('torch', 'training') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
