"""``python -m training.worker`` end to end: real processes, real files, the lines the agent reads."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from contracts.metrics import RESULT_PREFIX, parse_lines
from tests.training.harness import (
    REPO,
    assert_succeeded,
    launch,
    load_final_state,
    reference_run,
    tiny_config,
)
from training.checkpoint import complete_checkpoints, step_dir


def test_single_process_learns_the_markov_language_down_to_its_floor(tmp_path: Path) -> None:
    raw = tiny_config(
        tmp_path,
        model={"n_layers": 2, "d_model": 64, "n_heads": 4, "vocab": 64, "seq_len": 32},
        training={"steps": 200, "local_batch": 16, "lr": 1e-2, "warmup": 10},
        data={"seed": 0},
        checkpoint={"dir": None},
    )
    run = launch(raw, 1, tmp_path)
    assert_succeeded(run, 200)
    floor, uniform = run.result["entropy_floor"], torch.log(torch.tensor(64.0)).item()  # type: ignore[index]
    assert 0.5 < floor < 0.5 * uniform  # the language is far from uniform
    tail = [m["loss"] for m in run.metrics[-20:]]
    mean_tail = sum(tail) / len(tail)
    assert run.metrics[0]["loss"] > uniform - 0.2  # starts at chance
    assert mean_tail < floor + 0.15, f"last-20 mean loss {mean_tail:.3f} vs floor {floor:.3f}"
    assert mean_tail > floor - 0.1  # nothing beats the entropy rate (up to batch noise)
    # the metrics file holds the same per-step lines as stdout
    lines = [json.loads(s) for s in Path(raw["metrics_path"]).read_text().splitlines()]
    assert lines == run.metrics and [m["step"] for m in lines] == list(range(1, 201))
    m = lines[-1]
    assert m["tokens"] == 16 * 32 and m["tokens_per_s"] > 0 and 0 < m["compute_util"] <= 1
    assert m["compute_s"] <= m["wall_s"]
    # The step by part as the planner prices it, and the run's totals the calibration reads.
    assert m["data_s"] + m["compute_s"] + m["optimizer_s"] + m["sync_s"] == pytest.approx(m["wall_s"])
    result = run.result or {}
    assert result["parts_total_s"]["compute_s"] == pytest.approx(sum(x["compute_s"] for x in lines))
    assert result["first_step_s"]["wall_s"] == pytest.approx(lines[0]["wall_s"])
    assert result["last_step_s"]["wall_s"] == pytest.approx(lines[-1]["wall_s"])
    assert result["train_s"] > 0 and result["final_sync_s"] >= 0
    assert "startup_s" not in result  # started without CPN_SPAWNED_AT: nothing to measure from


def test_a_worker_reports_its_start_up_and_the_part_before_its_process_began(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The agent sets CPN_SPAWNED_AT as it starts the launcher; the time until this process began
    # is the launcher's part (here the harness starts the worker itself: a short gap).
    if sys.platform != "linux":
        pytest.skip("/proc is Linux's")
    spawned = time.time() - 1.0  # as if a launcher had taken a second before this worker
    monkeypatch.setenv("CPN_SPAWNED_AT", repr(spawned))
    run = launch(tiny_config(tmp_path), 1, tmp_path)
    assert_succeeded(run, 3)
    result = run.result or {}
    # The process's start is read to a clock tick (/proc's starttime and uptime, 10 ms each).
    assert result["startup_s"] > result["launcher_s"] >= 1.0 - 0.03
    assert result["launcher_s"] < 1.0 + 10.0  # the gap until the process began, not its imports


@pytest.mark.slow
def test_torchrun_launch_with_a_gpipe_pipeline(tmp_path: Path) -> None:
    raw = tiny_config(
        tmp_path, parallel={"pp": 2, "pp_schedule": "gpipe", "microbatches": 2}, checkpoint={"dir": None}
    )
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(raw))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "training.launch",  # torchrun as the agent starts it
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "training.worker",
            "--config",
            str(path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        env={**_env(), "OMP_NUM_THREADS": "1"},
    )
    results = parse_lines(proc.stdout, RESULT_PREFIX)
    assert len(results) == 1, proc.stdout + proc.stderr  # leader only
    assert results[0]["steps"] == 3 and results[0]["final_loss"] < results[0]["entropy_floor"] + 3
    assert [m["step"] for m in parse_lines(proc.stdout)] == [1, 2, 3]
    assert proc.returncode == 0 or "Traceback" not in proc.stderr, proc.stderr
    ref_losses, _ = reference_run(raw)
    assert [m["loss"] for m in parse_lines(proc.stdout)] == pytest.approx(ref_losses, rel=1e-5)


def test_pinned_data_refused_outside_its_region(tmp_path: Path) -> None:
    raw = tiny_config(tmp_path, data={"region": "cn-west"}, checkpoint={"dir": None})
    run = launch(raw, 1, tmp_path)
    assert run.returncodes == [2] and run.result is None
    assert "pinned to region 'cn-west'" in run.outputs[0] and "eu-west" in run.outputs[0]


def test_wrong_process_count_exits_2_with_the_arithmetic(tmp_path: Path) -> None:
    run = launch(tiny_config(tmp_path, parallel={"dp_local": 2, "tp": 2}), 1, tmp_path)
    assert run.returncodes == [2]
    assert "world size 1 != dp_local (2) x tp (2) x pp (1) = 4" in run.outputs[0]


@pytest.mark.slow
def test_resume_from_checkpoint_under_another_layout(tmp_path: Path) -> None:
    """Train 4 steps with FSDP, gradient accumulation and clipping (checkpoints at 2 and 4); drop
    step 4 and resume from step 2 with DDP: both runs must match the uninterrupted single-process
    reference."""
    raw = tiny_config(
        tmp_path,
        parallel={"dp_local": 2, "zero": 3},
        training={"steps": 4, "micro_batch": 2, "grad_clip": 0.5},
        checkpoint={"every": 2, "keep_last": 3},
    )
    first = launch(raw, 2, tmp_path)
    assert_succeeded(first, 4)
    ckpt = Path(raw["checkpoint"]["dir"])
    assert [s for s, _ in complete_checkpoints(ckpt)] == [2, 4]
    ref_losses, ref_params = reference_run(raw)
    assert [m["loss"] for m in first.metrics] == pytest.approx(ref_losses, rel=1e-5)
    shutil.rmtree(step_dir(ckpt, 4))

    raw["parallel"]["zero"] = 0
    second = launch(raw, 2, tmp_path)
    assert_succeeded(second, 4)
    assert "resumed from step 2" in second.outputs[0]
    assert second.result["resumed_from"] == 2  # type: ignore[index]
    assert [m["step"] for m in second.metrics] == [3, 4]
    assert [m["loss"] for m in second.metrics] == pytest.approx(ref_losses[2:], rel=1e-5)
    final = load_final_state(ckpt, tmp_path)
    for name, want in ref_params.items():
        torch.testing.assert_close(final["model"][name], want, atol=5e-5, rtol=0, msg=name)


def test_a_pipeline_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    """Each stage saves its own parameters and optimizer state: resumed from step 2, a two-stage
    pipeline trains steps 3 and 4 as the uninterrupted run did (each stage's optimizer state is
    its own, under its parameters' names, not another stage's)."""
    raw = tiny_config(
        tmp_path,
        parallel={"pp": 2, "pp_schedule": "gpipe", "microbatches": 2},
        training={"steps": 4},
        checkpoint={"every": 2, "keep_last": 3},
    )
    first = launch(raw, 2, tmp_path)
    assert_succeeded(first, 4)
    ckpt = Path(raw["checkpoint"]["dir"])
    shutil.rmtree(step_dir(ckpt, 4))
    second = launch(raw, 2, tmp_path)
    assert_succeeded(second, 4)
    assert second.result["resumed_from"] == 2  # type: ignore[index]
    assert [m["step"] for m in second.metrics] == [3, 4]
    assert [m["loss"] for m in second.metrics] == pytest.approx(
        [m["loss"] for m in first.metrics][2:], rel=1e-5
    )


@pytest.mark.slow
def test_bring_your_own_entrypoint_with_data_parallelism(tmp_path: Path) -> None:
    raw = tiny_config(
        tmp_path,
        model=None,
        data={"kind": "byo", "seed": 1},
        entrypoint="tests.training.byo_example:build",
        parallel={"dp_local": 2, "zero": 3},
        training={"steps": 40, "local_batch": 16, "lr": 3e-2, "warmup": 0},
    )
    run = launch(raw, 2, tmp_path)
    assert_succeeded(run, 40)
    losses = [m["loss"] for m in run.metrics]
    assert losses[-1] < 0.05 * losses[0], losses
    assert run.result["entropy_floor"] is None  # type: ignore[index]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


@pytest.mark.slow
def test_a_preempted_run_checkpoints_its_step_stops_and_resumes_there(tmp_path: Path) -> None:
    """The preemption file is there from the start: both ranks stop after step 1 with a complete
    checkpoint of it; run again without it, the run resumes from step 1 and matches the
    uninterrupted reference (no step lost or run twice)."""
    flag = tmp_path / "preempt"
    flag.write_text("room for another job")
    raw = tiny_config(
        tmp_path,
        parallel={"dp_local": 2},
        training={"steps": 4},
        checkpoint={"every": 100},  # no periodic checkpoint before the end: the one it has is on demand
        preempt_file=str(flag),
    )
    first = launch(raw, 2, tmp_path)
    assert first.returncodes == [0, 0], first.describe()
    assert first.result is not None and first.result["preempted"] is True
    assert first.result["steps"] == first.result["checkpoint_step"] == 1
    assert [m["step"] for m in first.metrics] == [1] and first.metrics[-1]["checkpoint_step"] == 1
    assert "preempted after step 1 (checkpoint 1)" in first.outputs[0]
    ckpt = Path(raw["checkpoint"]["dir"])
    assert [s for s, _ in complete_checkpoints(ckpt)] == [1]

    flag.unlink()
    second = launch(raw, 2, tmp_path)
    assert_succeeded(second, 4)
    assert second.result is not None and second.result["resumed_from"] == 1
    assert "preempted" not in second.result
    assert [m["step"] for m in second.metrics] == [2, 3, 4]
    ref_losses, _ = reference_run(raw)
    assert [m["loss"] for m in first.metrics + second.metrics] == pytest.approx(ref_losses, rel=1e-5)
