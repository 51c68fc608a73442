"""Each intra-cluster layout, run in real processes over gloo, must train exactly like one process.

Every case runs 3 steps of ``replace_sync_worker``: the real trainer, with a test engine on the
cross-region hook that at step 2 records the gathered replica and overwrites it with another
model's weights. The single-process reference does the same, so one run checks the layout's
losses, its final parameters (from its DCP checkpoint), ``gather_full_params`` (the recorded
replica) and ``scatter_full_params`` (training after the overwrite).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from contracts.worker_config import parse_worker_config
from tests.training import replace_sync_worker as W
from tests.training.harness import launch, load_final_state, reference_run, tiny_config
from training.checkpoint import latest_checkpoint
from training.models.gpt import GPT

# name -> (config overrides, processes). FSDP alone (with accumulation and clipping) is checked by
# test_worker's resume test and GPipe alone by its torchrun test, against the same reference.
CASES: dict[str, tuple[dict[str, Any], int]] = {
    "ddp_dp2_accum": ({"parallel": {"dp_local": 2}, "training": {"micro_batch": 2}}, 2),
    "tp2": ({"parallel": {"tp": 2}}, 2),
    "pp2_1f1b": ({"parallel": {"pp": 2, "pp_schedule": "1f1b", "microbatches": 4}}, 2),
    "pp2_tp2_1f1b_clip": (
        {"parallel": {"pp": 2, "tp": 2, "microbatches": 2}, "training": {"grad_clip": 0.5}},
        4,
    ),
    "dp2_tp2_zero1": ({"parallel": {"dp_local": 2, "tp": 2, "zero": 1}}, 4),
    "dp2_tp2_zero0": ({"parallel": {"dp_local": 2, "tp": 2, "zero": 0}}, 4),
    "ddp_dp2_pp2_gpipe": (
        {"parallel": {"dp_local": 2, "pp": 2, "pp_schedule": "gpipe", "microbatches": 2}},
        4,
    ),
    # Recomputation changes nothing numerically: the same tight tolerances as without it.
    "pp2_tp2_1f1b_ac": (
        {"parallel": {"pp": 2, "tp": 2, "microbatches": 2}, "training": {"activation_checkpointing": True}},
        4,
    ),
    "dp2_zero3_ac": (
        {"parallel": {"dp_local": 2, "zero": 3}, "training": {"activation_checkpointing": True}},
        2,
    ),
    # bf16 autocast against the fp32 reference: close, not equal (bf16 keeps 8 bits of mantissa).
    "tp2_pp2_bf16_ac": (
        {
            "parallel": {"pp": 2, "tp": 2, "microbatches": 2},
            "training": {"precision": "bf16", "activation_checkpointing": True},
        },
        4,
    ),
}
LOSS_RTOL = 1e-5
PARAM_ATOL = 5e-5  # one AdamW step moves a weight by ~lr = 3e-3: a wrong gradient shows far above this
BF16_LOSS_RTOL = 2e-2


def assert_bf16_close(got: list[torch.Tensor], want: list[torch.Tensor], start: list[torch.Tensor]) -> None:
    """bf16 against the fp32 reference. AdamW moves a weight by about lr per step whatever its
    gradient's size, so where bf16 flips the sign of a near-zero gradient a weight moves the other
    way: elementwise closeness means little. The whole update must still point the same way (a
    wrong layout's does not), and no weight may be further off than two steps of lr each."""
    moved = torch.cat([(g - s).flatten() for g, s in zip(got, start, strict=True)])
    ref = torch.cat([(w - s).flatten() for w, s in zip(want, start, strict=True)])
    cos = torch.nn.functional.cosine_similarity(moved, ref, dim=0).item()
    assert cos >= 0.9, f"the bf16 update points elsewhere than the fp32 one (cosine {cos:.3f})"
    assert (moved - ref).abs().max().item() <= 2 * 3e-3 * 3


def reference_with_replacement(
    raw: dict[str, Any],
) -> tuple[list[float], dict[str, torch.Tensor], list[torch.Tensor]]:
    model_cfg = parse_worker_config(raw).model
    assert model_cfg is not None
    replacement = list(GPT(model_cfg, seed=W.REPLACEMENT_SEED).parameters())
    recorded: list[torch.Tensor] = []

    def hook(step: int, model: GPT) -> None:
        if step == W.AT:
            recorded.extend(p.detach().clone() for p in model.parameters())
            with torch.no_grad():
                for p, new in zip(model.parameters(), replacement, strict=True):
                    p.copy_(new)

    losses, params = reference_run(raw, hook)
    return losses, params, recorded


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_layout_matches_single_process(case: str, tmp_path: Path) -> None:
    overrides, nproc = CASES[case]
    raw = tiny_config(tmp_path, **overrides)
    run = launch(raw, nproc, tmp_path, command=["tests/training/replace_sync_worker.py"])
    leader = tmp_path / "rank0.json"
    # gloo may abort at process exit after a correct run; the leader's result file is the verdict
    assert leader.exists(), run.describe()
    assert all((tmp_path / f"rank{r}.json").exists() for r in range(nproc)), run.describe()
    out = json.loads(leader.read_text())
    assert out["result"]["steps"] == 3
    assert out["calls"] == [[W.AT, len(list(GPT(parse_worker_config(raw).model).parameters()))]]  # type: ignore[arg-type]
    for r in range(1, nproc):
        assert json.loads((tmp_path / f"rank{r}.json").read_text())["calls"] == [[W.AT, 0]]

    ref_losses, ref_params, ref_recorded = reference_with_replacement(raw)  # fp32, no recomputation
    bf16 = raw["training"].get("precision") == "bf16"
    loss_rtol = BF16_LOSS_RTOL if bf16 else LOSS_RTOL
    losses = [m["loss"] for m in out["metrics"]]
    assert losses == pytest.approx(ref_losses, rel=loss_rtol)
    assert {m["precision"] for m in out["metrics"]} == {"bf16" if bf16 else "fp32"}
    assert out["metrics"][W.AT - 1]["sync"] == {
        "bytes_sent": {"peer": 1}
    }  # engine metrics reach the callback

    gathered = torch.load(tmp_path / "gathered.pt")
    assert [tuple(t.shape) for t in gathered] == [tuple(t.shape) for t in ref_recorded]
    final = load_final_state(tmp_path / "ckpt", tmp_path)["model"]
    assert set(final) == set(ref_params)
    if bf16:
        model_cfg = parse_worker_config(raw).model
        assert model_cfg is not None
        initial = [p.detach() for p in GPT(model_cfg, seed=raw["training"]["seed"]).parameters()]
        assert_bf16_close(gathered, ref_recorded, initial)
        return
    for got, want in zip(gathered, ref_recorded, strict=True):
        torch.testing.assert_close(got, want, atol=PARAM_ATOL, rtol=0)
    for name, want in ref_params.items():
        torch.testing.assert_close(final[name], want, atol=PARAM_ATOL, rtol=0, msg=name)
    # the leader stored the engine's own state beside the model
    meta = torch.load(latest_checkpoint(tmp_path / "ckpt") / "meta.pt", weights_only=False)  # type: ignore[operator]
    assert meta["step"] == 3 and meta["sync"]["rounds"] == 1 and int(meta["sync"]["last"]) == W.AT
