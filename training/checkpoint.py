"""Checkpoint and resume with torch.distributed.checkpoint (DCP).

Each rank writes its own shards (FSDP shards, TP shards, its pipeline stage) under
``<dir>/step_<N>/``; parameter and optimizer-state names are the full model's, so a checkpoint can
be loaded under a different parallel layout. The leader adds ``meta.pt`` (step, LR schedule, the
sync engine's state) and finally ``COMPLETE``: a directory without it is an interrupted save and is
never resumed from. The directory must be visible to every rank of a node; a group spanning nodes
makes each node's copy whole before marking it (``training.checkpoint_mirror``), and a run resumes
from the newest checkpoint every rank holds (``agreed_checkpoint``).
"""

from __future__ import annotations

import copy
import re
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.staging import BlockingAsyncStager
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.tensor import DTensor

from contracts.step_dirs import remove_step_dir
from training.checkpoint_mirror import NodeLayout, mirror, node_layout, share

_STEP_DIR = re.compile(r"^step_(\d+)$")
# The optimizer's state and param groups keyed by parameter name: a pipeline's stages hold
# different parameters, and nested per-group lists would collide between them in the checkpoint
# (every stage's first param group at one key, one stage's names loaded into another's).
_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)
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


def latest_checkpoint(root: str | Path, at_most: int | None = None) -> Path | None:
    found = [(s, p) for s, p in complete_checkpoints(root) if at_most is None or s <= at_most]
    return found[-1][1] if found else None


def agreed_checkpoint(
    root: str | Path, at_most: int | None = None, layout: NodeLayout | None = None
) -> Path | None:
    """Collective: the newest complete checkpoint (at most ``at_most``) that every rank's directory
    holds, so that all ranks resume from one step. With ``layout`` (a group spanning nodes) the
    newest any node holds is first sent to the nodes lacking it (``checkpoint_mirror.share``): a
    node new to the group may hold an older one, or none. Without it, a rank lacking every step
    the others hold makes every rank start as if there were none."""
    mine = [s for s, _ in complete_checkpoints(root) if at_most is None or s <= at_most]
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return step_dir(root, mine[-1]) if mine else None
    everyone: list[list[int] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    common = set(mine).intersection(*(set(e or ()) for e in everyone))
    newest = max((s for e in everyone for s in e or ()), default=None)
    if layout is not None and newest is not None and newest not in common:
        path, rank = step_dir(root, newest), dist.get_rank()
        holders = [h for h in layout.heads if newest in (everyone[h] or ())]
        if layout.is_head(rank):
            received = share(path, holders[0], rank not in holders, layout)
            if rank not in holders:
                (path / _DONE).write_text(str(newest))
                print(f"checkpoint step {newest}: {received} bytes received from the group", flush=True)
        dist.barrier()
        return path
    return step_dir(root, max(common)) if common else None


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
    msd, osd = get_state_dict(model, optimizer, options=_OPTIONS)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(path))
    if dist.get_rank() == 0:
        torch.save({"step": step, **extra}, path / "meta.pt")
        (path / _DONE).write_text(str(step))
        for _, old in complete_checkpoints(root)[:-keep_last]:
            remove_step_dir(old)
    dist.barrier()
    return path


class BackgroundSaver:
    """Checkpoints written while training goes on: ``save`` copies the step's state into memory
    (the only part the train loop pays) and returns; a thread writes the shards, ``meta.pt`` and
    ``COMPLETE``. One save is in flight at a time (the next waits for it). The writing thread's DCP
    collectives run on a process group of their own, so they never interleave with the training
    loop's. With ``spans_nodes`` (a torchrun group over several nodes) every node's copy is made
    whole before it is marked, and a save completes once every node's is (``checkpoint_mirror``).
    Collective: every rank builds one."""

    def __init__(self, keep_last: int, spans_nodes: bool = False) -> None:
        self.keep_last = keep_last
        self.group = dist.new_group(backend="gloo")
        self.layout = node_layout(self.group) if spans_nodes else None
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        self.pending: Future[int] | None = None
        self.completed: int | None = None

    def save(
        self, root: str | Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, extra: dict
    ) -> None:
        """``extra`` is the leader's (ignored elsewhere) and becomes the saver's: the caller hands
        over a copy (``CrossRegionSync.state_dict`` returns one) and keeps no reference to it."""
        self.wait()
        path = step_dir(root, step)
        msd, osd = get_state_dict(model, optimizer, options=_OPTIONS)
        # The state of this step, whatever the next steps do while the thread writes it. On the
        # CPU a plain copy (DCP's default staging, a generic deep copy, took several times as
        # long); a device's tensors go to the CPU through DCP's stager, which keeps shards' layout.
        on_cpu = all(p.device.type == "cpu" for p in model.parameters())
        state = {"model": msd, "optim": osd}
        state = snapshot(state) if on_cpu else BlockingAsyncStager().stage(state)
        meta = {"step": step, **extra} if dist.get_rank() == 0 else None
        self.pending = self.pool.submit(self._finish, state, root, path, step, meta)

    def _finish(self, state: dict, root: str | Path, path: Path, step: int, meta: dict | None) -> int:
        layout, rank = self.layout, dist.get_rank()
        # Who marks a copy complete: the leader, or with several nodes each node's head.
        marks = meta is not None if layout is None else layout.is_head(rank)
        if layout is not None:
            if marks:  # an earlier run's interrupted save of this step: none of its files may pass
                shutil.rmtree(path, ignore_errors=True)
            dist.barrier(group=self.group)
        dcp.save(state, checkpoint_id=str(path), process_group=self.group)  # every rank's shards
        if meta is not None:
            torch.save(meta, path / "meta.pt")
        if layout is not None and marks:
            mirror(path, layout)
        if marks:
            (path / _DONE).write_text(str(step))
            for _, old in complete_checkpoints(root)[: -self.keep_last]:
                remove_step_dir(old)
        if layout is not None:
            dist.barrier(group=self.group)  # reported complete only once every node's copy is
        return step

    def poll(self) -> int | None:
        """The step of the newest save that has completed (None before the first)."""
        if self.pending is not None and self.pending.done():
            self.completed, self.pending = self.pending.result(), None
        return self.completed

    def wait(self) -> int | None:
        """Block until the save in flight has completed; returns the newest completed step."""
        if self.pending is not None:
            self.completed, self.pending = self.pending.result(), None
        return self.completed

    def close(self) -> None:
        self.wait()
        self.pool.shutdown()


def snapshot(value: Any) -> Any:
    """A copy of a CPU state dict (nested dicts, lists, tuples) whose tensors share no memory with
    the originals (a DTensor keeps its layout, with a copy of its local shard)."""
    if isinstance(value, DTensor):
        local = value.to_local().detach().clone()
        mesh, placements = value.device_mesh, value.placements
        return DTensor.from_local(
            local, mesh, placements, run_check=False, shape=value.shape, stride=value.stride()
        )
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: snapshot(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(snapshot(v) for v in value)
    return copy.copy(value)


def load_checkpoint(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Collective. Loads model and optimizer in place; returns the leader's ``meta.pt`` dict."""
    path = Path(path)
    msd, osd = get_state_dict(model, optimizer, options=_OPTIONS)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"], options=_OPTIONS
    )
    return torch.load(path / "meta.pt", weights_only=False)
