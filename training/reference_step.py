"""A node's reference measurement: the real worker's train step on two small GPTs, at each precision.

    torchrun --standalone --nproc-per-node 1 -m training.reference_step --device cpu

The agent runs this at registration the way it runs a job's worker (same launcher, same
environment), so what it prints is what a job pays on this node: the start-up (spawn to the first
step: interpreter, imports, rendezvous, model build; per idle core, from the CPU time the
launcher and the worker spent) and, per precision, the step split as the
planner prices it. Two model sizes and two micro-batch counts separate the FLOP rate from the
fixed costs per micro-batch and per step; the optimizer, data and checkpoint costs are fitted per
parameter or token. On a CPU node it also times a gloo all-reduce between two of the host's CPU
ranks (``training.collective_probe``), which one process never makes. Prints one
``CPN_RESULT {json}`` line.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from contracts.model import GPTConfig, gpt_param_count, train_flops_per_token
from contracts.worker_config import CheckpointSpec, WorkerConfig
from training import collective_probe
from training.metrics import emit_result
from training.parallel.init import compute_cleanup, compute_init
from training.runtime import build_trainer
from training.worker import spawned_at

# (n_layers, d_model, n_heads, vocab, seq_len): a small and a larger model per device kind, so the
# difference in FLOPs between them is well above the fixed costs.
SHAPES = {
    "cpu": ((2, 128, 4, 256, 64), (4, 256, 8, 512, 128)),
    # A device of 24 GiB or more: the widths and sequence lengths its jobs run at. The small pair
    # left an H200 idle between kernels (28 TFLOPS, against 287 in a 1B model's training step).
    "cuda": ((4, 1024, 8, 16384, 1024), (8, 2048, 16, 32768, 2048)),
    "cuda-small": ((4, 512, 8, 8192, 256), (8, 1024, 16, 16384, 512)),
}
LARGE_DEVICE_BYTES = 24 * 2**30
MICRO_BATCHES = (1, 3)
# Timed steps after the warm-up ones, per device kind. A GPU's steps take milliseconds and its
# clocks ramp up over the first ones: two timed steps gave an H200's rate as 435 and 927 TFLOPS in
# two runs.
TIMED_STEPS = {"cpu": {"fp32": 3, "bf16": 2}, "cuda": {"fp32": 6, "bf16": 8}}
WARMUP_STEPS = {"cpu": 1, "cuda": 3}


def _config(
    shape: tuple[int, ...], precision: str, micro: int, ckpt_dir: str | None, kind: str = "cpu"
) -> WorkerConfig:
    n_layers, d_model, n_heads, vocab, seq_len = shape
    return WorkerConfig(
        job_id="reference",
        region="reference",
        cluster="reference",
        model=GPTConfig(n_layers=n_layers, d_model=d_model, n_heads=n_heads, vocab=vocab, seq_len=seq_len),
        training={
            "steps": WARMUP_STEPS[kind] + TIMED_STEPS[kind][precision],
            "local_batch": micro,
            "micro_batch": 1,
            "precision": precision,
        },
        checkpoint=CheckpointSpec(dir=ckpt_dir, keep_last=1),
    )


CLOCKS = {"wall": 0.0, "cpu": 0.0}  # over every timed step: how much of a core the steps got


def _timed_step(trainer: Any, cpu_clock: bool) -> dict[str, float]:
    """One train step's parts. On a CPU slot (one thread) each part is scaled by the share of the
    step the process was on a core: the slot's own speed, not what neighbours left of it (other
    agents measuring at the same time, other jobs); the host's load is reported apart."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    m = trainer.train_step()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    CLOCKS["wall"] += wall
    CLOCKS["cpu"] += cpu
    scale = min(1.0, cpu / wall) if cpu_clock and wall > 0 else 1.0
    return {k: m[k] * scale for k in ("data_s", "compute_s", "optimizer_s")}


def _run(cfg: WorkerConfig, ctx: Any, warmup: int) -> tuple[dict[str, float], float | None, int]:
    """Median step parts over the timed steps, the checkpoint write time, the parameter count."""
    trainer = build_trainer(cfg, ctx)
    cpu_clock = ctx.device.type == "cpu"
    try:
        steps = [_timed_step(trainer, cpu_clock) for _ in range(cfg.training.steps)][warmup:]
        parts = {k: statistics.median(s[k] for s in steps) for k in ("data_s", "compute_s", "optimizer_s")}
        saved = None
        if cfg.checkpoint.dir is not None:
            t0 = time.perf_counter()
            trainer.save()
            saved = time.perf_counter() - t0
    finally:
        trainer.close()
    assert cfg.model is not None
    return parts, saved, gpt_param_count(cfg.model)


def shapes(kind: str, device: torch.device) -> tuple[tuple[int, ...], ...]:
    """The two model shapes for this device: the small CUDA pair on a device under 24 GiB."""
    if kind == "cuda" and torch.cuda.get_device_properties(device).total_memory < LARGE_DEVICE_BYTES:
        return SHAPES["cuda-small"]
    return SHAPES[kind]


def measure_precision(kind: str, precision: str, ctx: Any) -> dict[str, float]:
    """One precision's rate and fixed costs (see the module docstring)."""
    per_mb, fixed, flops, params, opt, data, ckpt = [], [], [], [], [], [], []
    with tempfile.TemporaryDirectory(prefix="cpn-reference-") as tmp:
        for i, shape in enumerate(shapes(kind, ctx.device)):
            t: dict[int, dict[str, float]] = {}
            for m in MICRO_BATCHES:
                last = m == MICRO_BATCHES[-1]
                run_cfg = _config(shape, precision, m, f"{tmp}/{i}" if last else None, kind)
                t[m], saved, n = _run(run_cfg, ctx, WARMUP_STEPS[kind])
                if saved is not None:
                    ckpt.append((n, saved))
            lo, hi = MICRO_BATCHES
            u = max(0.0, (t[hi]["compute_s"] - t[lo]["compute_s"]) / (hi - lo))
            per_mb.append(u)
            fixed.append(max(0.0, t[lo]["compute_s"] - lo * u))
            cfg = _config(shape, precision, 1, None).model
            assert cfg is not None
            flops.append(train_flops_per_token(cfg) * cfg.seq_len)
            params.append(n)
            opt.append(statistics.median(t[m]["optimizer_s"] for m in MICRO_BATCHES))
            data.append((hi * cfg.seq_len, t[hi]["data_s"]))
    # Per micro-batch u = o + f / R: the two sizes give the rate R and the fixed part o.
    if per_mb[1] > per_mb[0] and flops[1] > flops[0]:
        rate = (flops[1] - flops[0]) / (per_mb[1] - per_mb[0])
        overhead = max(0.0, per_mb[0] - flops[0] / rate)
    else:  # too noisy to separate: all of it is FLOPs at the larger size's rate
        rate, overhead = flops[1] / max(per_mb[1], 1e-9), 0.0
    opt_slope = max(0.0, opt[1] - opt[0]) / (params[1] - params[0])
    opt_fixed = max(0.0, opt[0] - opt_slope * params[0])
    tokens, data_s = data[1]
    ck_params, ck_s = ckpt[-1]
    return {
        "tflops": rate / 1e12,
        "micro_batch_s": overhead,
        # The optimizer's fixed part (one call over every parameter group) counts with the step's.
        "step_s": statistics.median(fixed) + opt_fixed,
        "optimizer_s_per_mparam": opt_slope * 1e6,
        "data_s_per_mtoken": data_s / tokens * 1e6,
        "checkpoint_s_per_mparam": ck_s / ck_params * 1e6,
    }


def launcher_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) process ``pid`` has used so far, from ``/proc``; None elsewhere."""
    try:
        # Fields after the command name's closing parenthesis: state is field 3, utime 14, stime 15.
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def startup_per_idle_core(wall_s: float, worker_cpu_s: float, launcher_s: float | None) -> float:
    """Start-up as it would take on an idle core: the CPU the launcher (torchrun) and this worker
    spent before the first step, at most the wall time. Start-up is CPU work one after another
    (the launcher's imports, then the worker's), so its wall time on a host other processes crowd
    (several agents measuring at once at registration) overstates it by what they took; the CPU
    time does not. Without the launcher's figure, the wall time."""
    if launcher_s is None:
        return wall_s
    return min(wall_s, worker_cpu_s + launcher_s)


def collective_figures(device: str) -> dict[str, float]:
    """A gloo all-reduce between two CPU ranks of this host (``training.collective_probe``); zeros
    (not measured) on CUDA, whose ranks all-reduce over NCCL, or where the measurement fails."""
    none = {"collective_call_s": 0.0, "collective_gbps": 0.0, "collective_wait_s": 0.0}
    if device != "cpu":
        return none
    try:
        f = collective_probe.measure()
    except Exception as exc:  # noqa: BLE001 (any failure: the planner keeps the fabric's figures)
        print(f"collective probe failed: {exc!r}", file=sys.stderr, flush=True)
        return none
    return {"collective_call_s": f.call_s, "collective_gbps": f.gbps, "collective_wait_s": f.wait_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.reference_step", description=__doc__)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--precisions", default="fp32,bf16")
    args = parser.parse_args(argv)
    ctx = compute_init(args.device)
    ready = time.time()
    worker_cpu, launcher = time.process_time(), launcher_cpu_s(os.getppid())
    spawned = spawned_at()
    wall = ready - spawned if spawned is not None else None
    startup = startup_per_idle_core(wall, worker_cpu, launcher) if wall is not None else None
    # As the worker does before its loop (``training.worker``): the interpreter's exit then skips
    # the frozen heap, half of the teardown measured here (1.45 s -> 0.7 s on an idle core), so
    # the teardown this node registers is the one its jobs' workers pay.
    gc.collect()
    gc.freeze()
    ok = False
    try:
        rates = {p: measure_precision(args.device, p, ctx) for p in args.precisions.split(",") if p}
        # What the node's data-parallel ranks pay per collective, which one process never sees.
        collective = collective_figures(args.device) if ctx.is_leader else {}
        if ctx.is_leader:
            emit_result(
                {
                    # The real worker also builds its model before the first step: the small
                    # reference model's build is inside the per-step figures, close enough.
                    "startup_s": startup,
                    # The launcher's part, apart: it runs one process per node, not per slot.
                    "launcher_s": min(launcher, startup) if launcher is not None and startup else 0.0,
                    "startup_wall_s": wall,
                    "host_load_factor": max(1.0, CLOCKS["wall"] / CLOCKS["cpu"])
                    if args.device == "cpu" and CLOCKS["cpu"] > 0
                    else 0.0,
                    "rates": rates,
                    "torch_threads": torch.get_num_threads(),
                    **collective,
                }
            )
        ok = True
    finally:
        compute_cleanup(ok)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
