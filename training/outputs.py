"""The final model, written where the agent uploads it from (``cfg.outputs_dir``).

At the end of a run the task that holds the job's final model (the one the control plane gave
outputs to) writes, on its global rank 0:

- ``model.safetensors``: the full state dict (gathered from FSDP / TP shards and pipeline stages;
  under DDP every rank holds it whole), keys as ``model.state_dict()`` of the unwrapped model;
- ``config.json``: what built it (the GPT config or the entrypoint), the final loss, and for a
  bring-your-own job with an ``eval_dataset`` the mean loss of the final model on it
  (``eval_loss``) and how it was computed, so it can be reproduced from the file alone.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch import Tensor
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.utils.data import Dataset, default_collate

from contracts.artifacts import MODEL_CONFIG_OUTPUT, MODEL_OUTPUT

if TYPE_CHECKING:
    from training.runtime import Trainer

MODEL_FORMAT = "cpn-final-model/1"


def full_state_dict(trainer: Trainer) -> dict[str, Tensor]:
    """Collective: the whole model's parameters and buffers on global rank 0 (``{}`` elsewhere),
    on the CPU, contiguous and sharing no storage (safetensors refuses shared tensors)."""
    pp = trainer.dims.pp
    # One pipeline stage per rank: each gathers its stage whole, then the stage leaders' parts
    # meet on rank 0. Without a pipeline rank 0 alone receives the gathered tensors.
    options = StateDictOptions(full_state_dict=True, cpu_offload=pp == 1)
    local = get_model_state_dict(trainer.model, options=options)
    if pp > 1:
        leads = trainer.ctx.rank == trainer.dims.stage_leader(trainer.dims.pp_rank)
        mine = {k: v.detach().cpu() for k, v in local.items()} if leads else None
        parts: list[Any] = [None] * trainer.ctx.world_size if trainer.ctx.rank == 0 else []
        dist.gather_object(mine, parts if trainer.ctx.rank == 0 else None, dst=0)
        local = {}
        for part in parts:
            local.update(part or {})
    if trainer.ctx.rank != 0:
        return {}
    return {k: v.detach().to("cpu", copy=True).contiguous() for k, v in local.items()}


@torch.no_grad()
def evaluate(trainer: Trainer, dataset: Dataset[Any], batch_size: int) -> float:
    """Collective: the mean loss of the model on ``dataset``, in order, ``batch_size`` items a
    batch, each batch's loss weighted by its items, fp32. Every rank runs every batch (FSDP's
    forward is collective), so all return the same figure."""
    model = trainer.model
    was_training = model.training
    model.eval()
    n = len(dataset)  # type: ignore[arg-type]
    total, count = 0.0, 0
    for start in range(0, n, batch_size):
        items = [dataset[i] for i in range(start, min(n, start + batch_size))]
        x, y = default_collate(items)
        x, y = x.to(trainer.ctx.device), y.to(trainer.ctx.device)
        loss = trainer.forward_loss(model, x, y)
        total += float(loss.detach().double()) * len(items)
        count += len(items)
    model.train(was_training)
    return total / count if count else float("nan")


def model_config(trainer: Trainer, result: dict[str, Any]) -> dict[str, Any]:
    cfg = trainer.cfg
    return {
        "format": MODEL_FORMAT,
        "weights": MODEL_OUTPUT,
        "job_id": cfg.job_id,
        "entrypoint": cfg.entrypoint,
        "model": cfg.model.model_dump() if cfg.model is not None else None,
        "training_seed": cfg.training.seed,
        "data_seed": cfg.data.seed,
        "steps": result.get("steps"),
        "final_loss": result.get("final_loss"),
        "eval_loss": result.get("eval_loss"),
        "eval": result.get("eval"),
    }


def write_outputs(outputs_dir: str | Path, state: dict[str, Tensor], config: dict[str, Any]) -> None:
    """Write both files (each to a temporary name, then renamed: a file under its final name is
    whole)."""
    out = Path(outputs_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{MODEL_OUTPUT}.tmp"
    save_file(state, str(tmp), metadata={"format": MODEL_FORMAT})
    os.replace(tmp, out / MODEL_OUTPUT)
    tmp = out / f".{MODEL_CONFIG_OUTPUT}.tmp"
    tmp.write_text(json.dumps(config, indent=2, sort_keys=True))
    os.replace(tmp, out / MODEL_CONFIG_OUTPUT)


def finish_outputs(trainer: Trainer, result: dict[str, Any]) -> None:
    """Collective, after the run and its final exchange: the eval loss into ``result`` (every
    rank; a bring-your-own job with an eval dataset) and, with ``outputs_dir`` set, the model's
    files (rank 0)."""
    if trainer.eval_dataset is not None:
        batch = trainer.cfg.micro_batch
        result["eval_loss"] = evaluate(trainer, trainer.eval_dataset, batch)
        result["eval"] = {"items": len(trainer.eval_dataset), "batch_size": batch, "precision": "fp32"}
    if trainer.cfg.outputs_dir is None:
        return
    state = full_state_dict(trainer)
    if trainer.ctx.rank == 0:
        write_outputs(trainer.cfg.outputs_dir, state, model_config(trainer, result))
        result["outputs_written"] = sorted([MODEL_OUTPUT, MODEL_CONFIG_OUTPUT])
