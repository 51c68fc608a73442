"""Sync calibration: the in-process ring gives the real exchange's bits, a setting equal to the
baseline measures no penalty, the budget bounds it, and ``cpn calibrate`` writes a spec the
planner reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from contracts.errors import InvalidArgument
from contracts.job_spec import JobSpec
from contracts.model import GPTConfig
from contracts.worker_config import DataSpec, TrainingSpec
from cpn.cli import app
from tests.training.test_sync_collective import reduce_everywhere
from training.calibration import Setting, Slice, calibrate, candidates_for, paired_ratio, slice_for
from training.compression.codecs import get_codec
from training.sync.ring_sim import RingSim

TINY = {"n_layers": 1, "d_model": 16, "n_heads": 2, "vocab": 32, "seq_len": 16}


def _slice(**kw: object) -> Slice:
    base = {
        "model": GPTConfig(**TINY),
        "data": DataSpec(seed=3),
        "training": TrainingSpec(steps=200, lr=3e-3, warmup=2, seed=1),
        "local_batch": 4,
        "every": 4,
        "steps": 12,
        "heldout_batches": 4,
    }
    return Slice(**(base | kw))  # type: ignore[arg-type]


@pytest.mark.parametrize("compression", ["none", "int8"])
def test_the_in_process_ring_gives_the_bits_the_real_exchange_gives(tmp_path: Path, compression: str) -> None:
    regions = ["a", "b", "c"]
    gen = torch.Generator().manual_seed(2)
    xs = {r: torch.randn(30_000, generator=gen) for r in regions}
    out, _, rings = reduce_everywhere(
        tmp_path, xs, dict.fromkeys(regions, 1.0), rounds=4, compression=compression
    )
    assert all(rings.values())
    sim = RingSim(get_codec(compression), 1 << 20)
    for i in range(4):  # the residuals carried from round to round included
        assert torch.equal(sim.mean([xs[r] for r in regions]), out["a"][i])


def test_a_setting_equal_to_the_baseline_measures_no_penalty_and_int8_overlap_one() -> None:
    sl = _slice()
    delay = candidates_for(sl.every)[0].delay
    cal = calibrate(sl, [Setting("none", False), Setting("int8", True, delay, "mix")], budget_s=3600)
    assert cal is not None and [t.compression for t in cal.trials] == ["none", "int8"]
    same, late = cal.trials
    assert (same.loss_ratio, same.stderr) == (1.0, 0.0)  # the same code from the same start: the same model
    assert late.loss_ratio != 1.0 and late.stderr > 0 and (late.delay, late.merge) == (1, "mix")
    assert (cal.every, cal.steps, cal.regions, cal.heldout_batches) == (4, 12, 3, 4)


def test_the_budget_bounds_the_calibration() -> None:
    assert calibrate(_slice(), [Setting("int8", True, 1)], budget_s=1e-6) is None
    with pytest.raises(InvalidArgument, match="no candidate"):
        calibrate(_slice(), [], budget_s=10)


def test_paired_ratio_cancels_the_batches_own_difficulty() -> None:
    base = [2.0, 4.0, 3.0, 5.0]
    ratio, se = paired_ratio([b + 0.035 for b in base], base)
    assert ratio == pytest.approx(1.01) and se == pytest.approx(0.0)
    with pytest.raises(InvalidArgument, match="paired batches"):
        paired_ratio([1.0], [1.0])


def _spec(**sync: object) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "cal",
            "model": TINY,
            "data": {"seed": 4},
            "training": {"steps": 300, "global_batch_tokens": 16 * 12, "lr": 3e-3, "warmup_steps": 2},
            "sync": {"mode": "diloco", **sync},
        }
    )


def test_the_slice_is_the_jobs_start_with_each_regions_share_of_its_batch() -> None:
    sl = slice_for(_spec(every=10), regions=3, rounds=2)
    assert (sl.every, sl.steps, sl.local_batch, sl.regions) == (10, 20, 4, 3)
    assert sl.training.steps == 300 and sl.training.grad_clip == 1.0 and sl.data.seed == 4
    assert slice_for(_spec(), rounds=3).every == 20  # "auto": the planner's smallest H
    with pytest.raises(InvalidArgument, match="local data.path"):
        slice_for(_spec().model_copy(update={"data": _spec().data.model_copy(update={"kind": "tokens"})}))
    with pytest.raises(InvalidArgument):
        Slice(**{**_slice().__dict__, "regions": 1})


def test_cpn_calibrate_writes_a_spec_the_planner_reads(tmp_path: Path) -> None:
    job = tmp_path / "job.json"
    job.write_text(_spec(every=4).model_dump_json())
    out = tmp_path / "calibrated.json"
    args = ["calibrate", "--job", str(job), "--out", str(out), "--rounds", "2", "--local-batch", "2"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "int8 overlapped, 1 step(s) late" in result.output
    spec = JobSpec.from_yaml_or_json(out.read_text())
    cal = spec.sync.calibration
    assert cal is not None and cal.every == 4 and cal.steps == 8
    # The cheapest codec overlapped first; fp32 overlapped next only where int8 did not pass.
    tried = [(t.compression, t.overlap, t.merge) for t in cal.trials]
    assert tried[0] == ("int8", True, "progress")
    assert tried[1:] == ([] if cal.trials[0].passes() else [("none", True, "progress")])
    assert json.loads(out.read_text())["sync"]["every"] == 4
    bad = CliRunner().invoke(app, ["calibrate", "--job", str(job), "--out", str(out), "--regions", "1"])
    assert bad.exit_code == 2
