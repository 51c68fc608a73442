"""A worker of a two-node torchrun group for the rendezvous tests: joins its process group as
``training.worker`` does (``compute_init`` with the job's store secret), all-reduces a tensor,
prints the sum, and waits for the test's go (a file) before leaving, so the test can knock on the
group's port meanwhile."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from training.parallel.init import compute_cleanup, compute_init
from training.rendezvous import load_group


def main() -> int:
    group = load_group(os.environ["CPN_WORKER_CONFIG"])
    assert group is not None
    ctx = compute_init("cpu", timeout_s=120, store_secret=group.store_secret)
    t = torch.full((1024,), float(ctx.rank + 1))
    dist.all_reduce(t)
    print(f"CPN_TEST_SUM {t[0].item():g} rank {ctx.rank} of {ctx.world_size}", flush=True)
    go = Path(os.environ["CPN_TEST_GO"])
    deadline = time.monotonic() + 120
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    compute_cleanup(ok=go.exists())
    return 0 if go.exists() else 3


if __name__ == "__main__":
    sys.exit(main())
