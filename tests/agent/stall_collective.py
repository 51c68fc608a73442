"""A rank that all-reduces while its peer never does: the process group's timeout (the agent's
CPN_PG_TIMEOUT_S) must end it with a clear error instead of a hang. Rank 1 never takes part: it
waits until the launcher ends it, once rank 0 failed."""

from __future__ import annotations

import threading

import torch
import torch.distributed as dist

from training.parallel.init import compute_init

ctx = compute_init("cpu")
if ctx.rank == 0:
    dist.all_reduce(torch.ones(4))
    print("all-reduce returned", flush=True)
else:
    threading.Event().wait()
