"""Checkpoint and resume with torch.distributed.checkpoint (DCP).

Each rank writes its own shards (FSDP shards, TP shards, its pipeline stage) under
``<dir>/step_<N>/``; parameter and optimizer-state names are the full model's, so a checkpoint can
be loaded under a different parallel layout. The leader adds ``meta.pt`` (step, LR schedule, the
sync engine's state) and finally ``COMPLETE``: a directory without it is an interrupted save and is
never resumed from. The directory must be visible to every rank of the cluster (shared disk).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

_STEP_DIR = re.compile(r"^step_(\d+)$")
_DONE = "COMPLETE"


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step_{step:08d}"


def complete_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for d in root.iterdir():
        m = _STEP_DIR.match(d.name)
        if m and (d / _DONE).exists():
            found.append((int(m.group(1)), d))
    return sorted(found)


def latest_checkpoint(root: str | Path) -> Path | None:
    found = complete_checkpoints(root)
    return found[-1][1] if found else None


def save_checkpoint(
    root: str | Path,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    extra: dict[str, Any],
    keep_last: int,
) -> Path:
    """Collective. ``extra`` (step, scheduler, sync state...) is written by the leader only."""
    path = step_dir(root, step)
    msd, osd = get_state_dict(model, optimizer)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(path))
    if dist.get_rank() == 0:
        torch.save({"step": step, **extra}, path / "meta.pt")
        (path / _DONE).write_text(str(step))
        for _, old in complete_checkpoints(root)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return path


def load_checkpoint(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Collective. Loads model and optimizer in place; returns the leader's ``meta.pt`` dict."""
    path = Path(path)
    msd, osd = get_state_dict(model, optimizer)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return torch.load(path / "meta.pt", weights_only=False)
