"""``benchmarks/gpu_validate.py``: without CUDA it says so and exits 0; its training ranks' own
code (the worker's trainer under torchrun, FSDP2 and TP, the all-reduce timing) and the planner
figures it compares them with run here on CPU with a small model, so the script a GPU node runs
is the one tested."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu_validate  # noqa: E402

TINY = {"n_layers": 2, "d_model": 64, "n_heads": 4, "vocab": 128, "seq_len": 32}


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the script measures")
def test_without_cuda_it_says_so_and_exits_0() -> None:
    done = subprocess.run([sys.executable, "benchmarks/gpu_validate.py"], cwd=REPO, capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("gpu_validate: no CUDA device here")
    assert json.loads(lines[-1])["cuda"] is False


def test_the_layout_and_peak_figures() -> None:
    assert gpu_validate.layout(8, None) == (2, 4) and gpu_validate.layout(1, None) == (1, 1)
    assert gpu_validate.layout(8, 8) == (8, 1)
    with pytest.raises(SystemExit, match="--tp 3"):
        gpu_validate.layout(8, 3)
    assert gpu_validate.peak_tflops("NVIDIA H200") == 989.0
    assert gpu_validate.peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert gpu_validate.peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert gpu_validate.peak_tflops("NVIDIA L4") == 121.0 and gpu_validate.peak_tflops("NVIDIA L40S") == 362.0
    assert gpu_validate.peak_tflops("Tesla T4") is None


@pytest.mark.slow
def test_the_ranks_code_runs_under_torchrun_and_the_report_compares_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = argparse.Namespace(steps=3, warmup=1, tp=2, dp=1, zero=2, local_batch=4, micro_batch=2,
                              timeout_s=600, device="cpu", model_json=json.dumps(TINY))  # fmt: skip
    ranks = gpu_validate.train(args, 2, tmp_path)
    assert [r["rank"] for r in ranks] == [0, 1]
    # TP ranks of one replica compute one loss; the all-reduce was timed between them.
    assert ranks[0]["loss_first"] == ranks[1]["loss_first"] and math.isfinite(ranks[0]["loss_last"])
    assert all(r["step_s"] > 0 and r["busbw_gbytes_s"] > 0 for r in ranks)
    monkeypatch.setattr(gpu_validate, "MODEL", TINY)
    ref = {"tflops": 0.05, "micro_batch_s": 0.001, "step_s": 0.002}
    est = gpu_validate.planner_estimates(args, ref, 450.0)
    assert est["memory_bytes"] > 0 and est["step_s"] > 0
    links = {"uuids": [], "link_gbytes_s": 450.0, "link": "nvlink"}
    out = gpu_validate.report(args, "NVIDIA H200", 2, links, ref, ranks, est)
    assert out["params"] == 118_528 and out["peak_tflops"] == 989.0
    assert out["memory"][0]["rel_err"] is None  # no CUDA allocator here: nothing measured, nothing claimed
    slowest = max(r["step_s"] for r in ranks)  # the report rounds its step_s: compare with the ranks' own
    assert out["step_s"] == round(slowest, 5)
    assert out["step_rel_err"] == round((est["step_s"] - slowest) / slowest, 4)
    parts = out["step_parts_s"]
    assert set(parts) == set(gpu_validate.STEP_PARTS) and 0 < parts["compute_s"] <= parts["wall_s"]
    assert set(out["targets_met"]) == {"mfu", "memory", "step_time"} and out["targets_met"]["memory"] is False
    json.dumps(out, allow_nan=False)  # one valid JSON line
