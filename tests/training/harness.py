"""Launch real worker processes the way torchrun does (same env contract), and a single-process
reference run to compare them against."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from contracts.metrics import RESULT_PREFIX, parse_lines
from contracts.worker_config import WorkerConfig, parse_worker_config
from tests.processes import free_port
from tests.training.forked_ranks import Rank
from training.checkpoint import latest_checkpoint
from training.data.streams import build_stream
from training.models.gpt import GPT
from training.runtime import build_optimizer, lr_lambda

REPO = Path(__file__).resolve().parents[2]


def tiny_config(tmp: Path, **overrides: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "job_id": "t",
        "region": "eu-west",
        "cluster": "c0",
        "model": {"n_layers": 2, "d_model": 32, "n_heads": 4, "vocab": 32, "seq_len": 16},
        "data": {"kind": "synthetic-markov", "seed": 3},
        "training": {"steps": 3, "local_batch": 4, "lr": 3e-3, "warmup": 1, "seed": 7},
        "metrics_path": str(tmp / "metrics.jsonl"),
        "checkpoint": {"dir": str(tmp / "ckpt")},
        "device": "cpu",
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    return cfg


@dataclass
class Run:
    returncodes: list[int]
    outputs: list[str]
    metrics: list[dict[str, Any]]
    result: dict[str, Any] | None

    def describe(self) -> str:
        return "\n".join(
            f"--- rank {i} rc={rc}\n{out[-4000:]}"
            for i, (rc, out) in enumerate(zip(self.returncodes, self.outputs, strict=True))
        )


def launch(
    cfg: dict[str, Any], nproc: int, tmp: Path, timeout: float = 120.0, command: list[str] | None = None
) -> Run:
    """``nproc`` rank processes with torchrun's env variables (forked as ``forked_ranks`` does),
    running ``training.worker --config CFG`` or ``COMMAND... CFG`` (``-m MODULE ...`` or a script)."""
    path = tmp / "cfg.json"
    path.write_text(json.dumps(cfg))
    port = free_port()
    ranks = []
    for rank in range(nproc):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": str(nproc),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(nproc),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(REPO),
        }
        argv = [*command, str(path)] if command else ["-m", "training.worker", "--config", str(path)]
        ranks.append(Rank(argv, env, tmp / f"rank{rank}.out", REPO))
    outputs = []
    deadline = time.monotonic() + timeout
    for r in ranks:
        note = ""
        try:
            r.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            r.kill()  # a hung rank: its output still tells what it was doing
            r.wait()
            note = f"\n[killed after {timeout:.0f}s timeout]"
        outputs.append(r.output.read_text(errors="replace") + note)
    results = parse_lines(outputs[0], RESULT_PREFIX)
    return Run([r.wait() for r in ranks], outputs, parse_lines(outputs[0]), results[-1] if results else None)


def assert_succeeded(run: Run, steps: int) -> None:
    """Every rank exited 0 — or, for gloo's known abort at process teardown, the leader printed its
    result after the final step and no rank reported an error."""
    assert run.result is not None, run.describe()
    assert run.result["steps"] == steps, run.describe()
    assert not any("CPN_ERROR" in o or "Traceback" in o.split(RESULT_PREFIX)[0] for o in run.outputs), (
        run.describe()
    )
    if any(rc != 0 for rc in run.returncodes):
        assert all("Traceback" not in o for o in run.outputs), run.describe()


def load_final_state(ckpt_root: Path, tmp: Path) -> dict[str, Any]:
    path = latest_checkpoint(ckpt_root)
    assert path is not None, f"no complete checkpoint under {ckpt_root}"
    out = tmp / "final.pt"
    dcp_to_torch_save(str(path), str(out))
    return torch.load(out, weights_only=False)


def reference_run(
    raw: dict[str, Any], after_step: Callable[[int, GPT], None] | None = None
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """One process, no parallelism: every global replica's batch concatenated into one step."""
    cfg: WorkerConfig = parse_worker_config(raw)
    assert cfg.model is not None
    torch.manual_seed(0)
    model = GPT(cfg.model, seed=cfg.training.seed)
    opt = build_optimizer(model, cfg)
    t = cfg.training
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_lambda(s, t.warmup, t.steps, t.min_lr_ratio))
    streams = [
        build_stream(
            cfg.data,
            worker_region=cfg.region,
            vocab=cfg.model.vocab,
            seq_len=cfg.model.seq_len,
            replica=cfg.replica_offset + r,
            replicas=cfg.global_replicas,
        )
        for r in range(cfg.parallel.dp_local)
    ]
    losses = []
    for step in range(1, t.steps + 1):
        xs, ys = zip(*(s.batch(step, cfg.local_batch) for s in streams), strict=True)
        _, loss = model(torch.cat(xs), torch.cat(ys))
        loss.backward()
        if t.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        if after_step is not None:
            after_step(step, model)
        losses.append(float(loss.detach()))
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}
