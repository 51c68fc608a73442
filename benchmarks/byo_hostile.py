"""Hostile entrypoints for ``benchmarks/byo_job.py`` (packed as ``hostile.py`` in a user's code).

Each tries one thing a tenant must not do on a provider's node and prints what it got:
``ATTEMPT <what>`` first, then ``FOUND <path> <sha256>`` for every file it read, or ``WROTE
<path>`` / ``SIGNALLED <pid>``. The benchmark judges on the node's side: a FOUND whose hash is the
real node key's or another job's file, a WROTE file that exists on the node, an agent that died, a
task that wrote past its disk quota. Each then returns a small job, so the run ends normally.
"""

from __future__ import annotations

import hashlib
import os
import signal
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from training.byo import BYOJob


def _job() -> BYOJob:
    x = torch.randn(64, 4)
    return BYOJob(
        model=nn.Linear(4, 1),
        dataset=TensorDataset(x, x.sum(1, keepdim=True)),
        loss_fn=nn.functional.mse_loss,
    )


def _ancestors() -> list[Path]:
    here = Path.cwd().resolve()
    return [here, *here.parents]


def _found(path: Path) -> None:
    try:
        data = path.read_bytes()
    except OSError as exc:
        print(f"DENIED {path}: {exc.__class__.__name__}", flush=True)
        return
    print(f"FOUND {path} sha256:{hashlib.sha256(data).hexdigest()}", flush=True)


def read_node_key(cfg: Any) -> BYOJob:
    print("ATTEMPT read the node key", flush=True)
    for d in _ancestors():
        for name in ("agent-state.json", "node.key", "agent.key"):
            if (d / name).exists():
                _found(d / name)
    for key, value in os.environ.items():  # a credential handed down in the environment
        if any(w in key.upper() for w in ("TOKEN", "SECRET", "KEY")):
            print(f"FOUND env:{key} sha256:{hashlib.sha256(value.encode()).hexdigest()}", flush=True)
    for pid in os.listdir("/proc"):  # another process's environment
        if pid.isdigit() and int(pid) != os.getpid():
            _found(Path(f"/proc/{pid}/environ"))
    return _job()


def read_other_job(cfg: Any) -> BYOJob:
    print("ATTEMPT read another job's directory", flush=True)
    for d in _ancestors():
        for sub in ("assignments", "checkpoints"):
            base = d / sub
            if base.is_dir():
                for path in base.rglob("*"):
                    if path.is_file() and Path.cwd().resolve() not in path.parents:
                        _found(path)
    return _job()


def write_outside(cfg: Any) -> BYOJob:
    print("ATTEMPT write outside the task's directory", flush=True)
    targets = [d / "canary-outside" for d in _ancestors()[1:]] + [Path("/usr/local/canary-outside")]
    for target in targets:
        try:
            target.write_text("written by a tenant")
            print(f"WROTE {target}", flush=True)
        except OSError as exc:
            print(f"DENIED {target}: {exc.__class__.__name__}", flush=True)
    return _job()


def signal_agent(cfg: Any) -> BYOJob:
    print("ATTEMPT signal the agent", flush=True)
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"-m agent" in cmdline or b"cpn agent" in cmdline:
            try:
                os.kill(int(pid), signal.SIGKILL)
                print(f"SIGNALLED {pid} {cmdline[:120]!r}", flush=True)
            except OSError as exc:
                print(f"DENIED kill {pid}: {exc.__class__.__name__}", flush=True)
    return _job()


def fill_disk(cfg: Any) -> BYOJob:
    print("ATTEMPT fill the disk", flush=True)
    block = os.urandom(1 << 20)
    written = 0
    try:
        with open("filler.bin", "wb") as f:
            while written < 64 * 1024**3:
                f.write(block)
                f.flush()
                written += len(block)
                if written % (256 << 20) == 0:
                    print(f"WROTE filler.bin {written}", flush=True)
    except OSError as exc:
        print(f"DENIED filler.bin after {written} bytes: {exc.__class__.__name__}", flush=True)
    return _job()
