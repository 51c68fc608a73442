"""All distributed setup in one place: process group, device, threads.

Under torchrun the env (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT) says
everything. Without it the process is a world of one, with a real (in-memory) process group so
the same code path runs everywhere.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from contracts.worker_config import PG_TIMEOUT_ENV
from training.rendezvous import worker_store


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str

    @property
    def is_leader(self) -> bool:
        return self.rank == 0


def pg_timeout_s(env: Mapping[str, str], default: float = 600.0) -> float:
    """The process group's timeout: the node's (the agent's ``--nccl timeout_s=``, in
    ``CPN_PG_TIMEOUT_S``), else ``default``. A collective waiting longer for a peer fails its rank
    (NCCL's watchdog aborts it; gloo raises), so a dead peer ends the task instead of hanging it."""
    raw = env.get(PG_TIMEOUT_ENV, "")
    try:
        value = float(raw)
    except ValueError:
        return default
    return value if math.isfinite(value) and 1.0 <= value <= 86400.0 else default


def compute_init(
    device: str = "auto", timeout_s: float | None = None, store_secret: str | None = None
) -> DistContext:
    """``store_secret``: the job's, for a group spanning nodes (``training.rendezvous``): the
    process group's keys go under it, in the node's end of the authenticated rendezvous.
    ``timeout_s``: None, the node's (``pg_timeout_s``)."""
    if timeout_s is None:
        timeout_s = pg_timeout_s(os.environ)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if use_cuda:
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
        backend = "nccl"
    else:
        dev = torch.device("cpu")
        backend = "gloo"
        if "OMP_NUM_THREADS" not in os.environ:
            # Processes on one host share its cores; oversubscribing threads slows everyone down.
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, local_world)))
    if world > 1 and "MASTER_ADDR" not in os.environ:
        raise RuntimeError(f"WORLD_SIZE={world} but MASTER_ADDR is not set: launch with torchrun")
    if not dist.is_initialized():
        timeout = timedelta(seconds=timeout_s)
        if "MASTER_ADDR" in os.environ and store_secret is not None:
            store = worker_store(store_secret, timeout)
            dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
        elif "MASTER_ADDR" in os.environ:
            dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout)
        else:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    return DistContext(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=local_rank,
        device=dev,
        backend=backend,
    )


def compute_cleanup(ok: bool = True) -> None:
    """Tear the process group down. After a failure, skip the barrier: peers may never reach it."""
    if dist.is_initialized():
        if ok:
            dist.barrier()
        dist.destroy_process_group()
