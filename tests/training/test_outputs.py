"""The final model the worker leaves in ``outputs_dir``: whole (gathered from shards), reloadable
into the user's own model class, and reproducing the eval loss the worker reported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from contracts.artifacts import MODEL_CONFIG_OUTPUT, MODEL_OUTPUT
from tests.training import byo_eval_example
from tests.training.harness import assert_succeeded, launch, reference_run, tiny_config


def _eval_loss(model: torch.nn.Module, batch: int) -> float:
    _, held_out = byo_eval_example.data(1)
    x, y = held_out.tensors
    total = 0.0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            total += float(torch.nn.functional.mse_loss(model(x[i : i + batch]), y[i : i + batch])) * len(
                x[i : i + batch]
            )
    return total / len(x)


@pytest.mark.slow
@pytest.mark.parametrize("zero", [0, 3])
def test_the_final_model_is_written_whole_and_reproduces_its_eval_loss(tmp_path: Path, zero: int) -> None:
    out = tmp_path / "outputs"
    raw = tiny_config(
        tmp_path,
        model=None,
        data={"kind": "byo", "seed": 1},
        entrypoint="tests.training.byo_eval_example:build",
        parallel={"dp_local": 2, "zero": zero},
        training={"steps": 20, "local_batch": 16, "micro_batch": 8, "lr": 3e-2, "warmup": 0},
        outputs_dir=str(out),
    )
    run = launch(raw, 2, tmp_path)
    assert_succeeded(run, 20)
    assert run.result is not None
    assert run.result["outputs_written"] == [MODEL_CONFIG_OUTPUT, MODEL_OUTPUT]
    meta = json.loads((out / MODEL_CONFIG_OUTPUT).read_text())
    assert meta["entrypoint"] == "tests.training.byo_eval_example:build"
    assert meta["final_loss"] == run.result["final_loss"] and meta["eval"]["batch_size"] == 8
    state = load_file(str(out / MODEL_OUTPUT))
    model = byo_eval_example.model()
    assert set(state) == set(model.state_dict())  # full tensors under the plain model's names
    model.load_state_dict(state)
    assert abs(_eval_loss(model, 8) - run.result["eval_loss"]) < 1e-4
    assert run.result["eval_loss"] < 0.5 * _eval_loss(byo_eval_example.model(), 8)  # it trained


@pytest.mark.slow
def test_no_outputs_dir_no_files_but_the_eval_loss_still_reported(tmp_path: Path) -> None:
    raw = tiny_config(
        tmp_path,
        model=None,
        data={"kind": "byo", "seed": 1},
        entrypoint="tests.training.byo_eval_example:build",
        training={"steps": 2, "local_batch": 16, "lr": 3e-2, "warmup": 0},
    )
    run = launch(raw, 1, tmp_path)
    assert_succeeded(run, 2)
    assert run.result is not None and run.result["eval_loss"] > 0
    assert "outputs_written" not in run.result


@pytest.mark.slow
def test_a_pipelines_stages_meet_in_one_model_file_equal_to_the_reference_run(tmp_path: Path) -> None:
    out = tmp_path / "outputs"
    raw = tiny_config(
        tmp_path,
        parallel={"pp": 2, "pp_schedule": "gpipe", "microbatches": 2},
        checkpoint={"dir": None},
        outputs_dir=str(out),
    )
    run = launch(raw, 2, tmp_path)
    assert_succeeded(run, 3)
    state = load_file(str(out / MODEL_OUTPUT))
    _, reference = reference_run(raw)
    assert set(reference) <= set(state), sorted(set(reference) - set(state))
    for name, value in reference.items():
        torch.testing.assert_close(state[name], value, rtol=1e-4, atol=1e-5)
    assert json.loads((out / MODEL_CONFIG_OUTPUT).read_text())["model"]["n_layers"] == 2
