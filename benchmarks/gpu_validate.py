"""What cpn's CUDA path does on a real GPU node, against what the planner says it will do.

    python benchmarks/gpu_validate.py [--steps 50] [--warmup 5] [--tp N] [--zero K]

On a machine with CUDA it uses every local GPU and measures, with the worker's own trainer
(``training.runtime.build_trainer``, the code a job runs):

- the MFU of a GPT of about 1B parameters in bf16 (autocast, fp32 master weights, as the worker
  trains), FSDP2 over the data-parallel ranks and tensor parallelism inside the node when there
  are several GPUs, over ``--steps`` steps after ``--warmup``;
- per rank, the planner's memory estimate (``cost_model.memory_per_device``) against
  ``torch.cuda.max_memory_allocated``;
- the planner's step-time estimate (``cost_model.replica_time`` at the node's reference-step rate
  and NVML link figure) against the measured step;
- the NCCL all-reduce bus bandwidth against the node's NVLink (or PCIe) figure from NVML;
- the reference step's rate (``training.reference_step``, what the node registers) against the
  training step's.

On a GPU image that has torch but not cpn's own dependencies (pydantic, grpcio with its health and
reflection services, a protobuf runtime as new as ``proto/``'s stubs), install them beside it
(``pip install --target DIR``) and put DIR on PYTHONPATH: the ranks and the reference step keep it.

It prints a table and one JSON line. Without CUDA it says so, prints a JSON line saying so and
exits 0 (tests/benchmarks/test_gpu_validate.py runs that branch). The training ranks run under
torchrun as the agent launches them (``--worker`` is that rank's entry).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# ~1.04B parameters (contracts.model.gpt_param_count): 18 blocks of width 2048, 32k vocabulary.
MODEL = {"n_layers": 18, "d_model": 2048, "n_heads": 16, "vocab": 32768, "seq_len": 2048}
# Dense bf16 tensor-core peak (no sparsity), TFLOPS, by the name NVML reports (longest match wins).
PEAK_BF16_TFLOPS = {
    "H200": 989.0,
    "H100 80GB HBM3": 989.0,  # SXM
    "H100 NVL": 835.0,
    "H100 PCIe": 756.0,
    "GH200": 989.0,
    "B200": 2250.0,
    "A100": 312.0,
    "L40S": 362.0,
    "L4": 121.0,
    "A10": 125.0,
}
ALLREDUCE_BYTES = 256 * 1024**2  # large enough for NCCL's bus bandwidth to plateau
TARGETS = {"mfu": 0.40, "memory_rel_err": 0.10, "step_rel_err": 0.15}
RESULT_PREFIX = "CPN_RESULT "
STEP_PARTS = ("data_s", "compute_s", "optimizer_s", "sync_s", "wall_s")


def peak_tflops(name: str) -> float | None:
    hits = [k for k in PEAK_BF16_TFLOPS if k in name]
    return PEAK_BF16_TFLOPS[max(hits, key=len)] if hits else None


def layout(n_gpus: int, tp: int | None) -> tuple[int, int]:
    """(tp, dp) over the node's GPUs: TP 2 inside the node when there are several (a ~1B model
    gains nothing from wider TP), FSDP2 over the rest."""
    if tp is None:
        tp = 2 if n_gpus > 1 and n_gpus % 2 == 0 else 1
    if tp < 1 or n_gpus % tp or MODEL["n_heads"] % tp:
        raise SystemExit(
            f"gpu_validate: --tp {tp} must divide the {n_gpus} GPU(s) and {MODEL['n_heads']} heads"
        )
    return tp, n_gpus // tp


def rel_err(estimate: float, measured: float) -> float | None:
    """(estimate − measured) / measured; None where nothing was measured."""
    return round((estimate - measured) / measured, 4) if measured > 0 else None


# ---------------------------------------------------------------- one training rank (--worker)


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _allreduce_busbw(world: int, device: str, nbytes: int) -> float | None:
    """All-reduce bus bandwidth over every rank, GB/s (nccl-tests' busbw: algbw·2(n−1)/n)."""
    import torch
    import torch.distributed as dist

    if world < 2:
        return None
    x = torch.ones(nbytes // 2, dtype=torch.bfloat16, device=device)
    for _ in range(5):
        dist.all_reduce(x)
    _sync(device)
    dist.barrier()
    iters, t0 = 20, time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    _sync(device)
    elapsed = (time.perf_counter() - t0) / iters
    del x
    if device == "cuda":
        torch.cuda.empty_cache()
    return nbytes / elapsed * 2 * (world - 1) / world / 1e9


def worker(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    from contracts.worker_config import WorkerConfig
    from training.parallel.init import compute_cleanup, compute_init
    from training.runtime import build_trainer

    cuda = args.device == "cuda"
    ctx = compute_init(args.device)
    busbw = _allreduce_busbw(ctx.world_size, args.device, ALLREDUCE_BYTES if cuda else 1 << 20)
    cfg = WorkerConfig(
        job_id="gpu-validate",
        region="local",
        cluster="local",
        model=json.loads(args.model_json) if args.model_json else MODEL,
        training={
            "steps": args.warmup + args.steps,
            "local_batch": args.local_batch,
            "micro_batch": args.micro_batch,
            "precision": "bf16",
            "warmup": 0,
        },
        parallel={"dp_local": args.dp, "tp": args.tp, "zero": args.zero},
        device=args.device,
    )
    trainer = build_trainer(cfg, ctx)
    if cuda:  # the training peak from here: the model built (held since), not its unsharded copy
        torch.cuda.reset_peak_memory_stats()
    ok = False
    try:
        for _ in range(args.warmup):
            trainer.train_step()
        _sync(args.device)
        dist.barrier()
        t0 = time.perf_counter()
        parts = [trainer.train_step() for _ in range(args.steps)]
        _sync(args.device)
        dist.barrier()
        step_s = (time.perf_counter() - t0) / args.steps
        result = {
            "rank": ctx.rank,
            "step_s": step_s,
            "data_s": statistics.median(p.get("data_s", 0.0) for p in parts),
            # where a step's time went, as the worker splits it (median over the timed steps)
            "parts_s": {k: statistics.median(p.get(k, 0.0) for p in parts) for k in STEP_PARTS},
            "max_memory_allocated": torch.cuda.max_memory_allocated() if cuda else 0,
            "busbw_gbytes_s": busbw,
            "loss_first": parts[0].get("loss"),
            "loss_last": parts[-1].get("loss"),
        }
        Path(args.out, f"rank{ctx.rank}.json").write_text(json.dumps(result))
        ok = True
    finally:
        trainer.close()
        compute_cleanup(ok)
    return 0


# ---------------------------------------------------------------- the node (the launcher)


def node_links() -> dict[str, Any]:
    """The node's GPUs as NVML reads them (agent.nvml): their UUIDs and the all-reduce figure."""
    from agent.gpu_reading import parse_reading
    from agent.gpu_topology import nvlink_islands, peer_gbytes_s
    from agent.gpu_visible import visible_units
    from agent.nvml import read_node

    try:
        reading = parse_reading(read_node())
        units = visible_units(reading, os.environ.get("CUDA_VISIBLE_DEVICES"))
    except Exception as exc:  # noqa: BLE001 (a figure the report goes without, saying why)
        return {"uuids": [], "link_gbytes_s": None, "link": f"unknown ({exc})"}
    islands = nvlink_islands(reading, units)
    link = (
        "nvlink" if len(set(islands)) == 1 and len(units) > 1 and units[0].gpu.nvlink_active_links else "pcie"
    )
    return {"uuids": [u.uuid for u in units], "link_gbytes_s": peer_gbytes_s(units, islands), "link": link}


def run_kept(
    cmd: list[str], env: dict[str, str], timeout_s: float, capture: bool
) -> subprocess.CompletedProcess[str]:
    """``cmd`` under a keeper (``contracts.lifetime``): torchrun's ranks end with this script,
    however it ends, and the whole tree is stopped after ``timeout_s``."""
    from contracts.lifetime import Watched, keeper_command

    kept, fds = keeper_command(cmd, grace_s=5)
    pipe = subprocess.PIPE if capture else None
    proc = subprocess.Popen(kept, env=env, cwd=REPO, pass_fds=fds, stdout=pipe, stderr=pipe, text=True)
    watched = Watched(proc, time.monotonic() + timeout_s)
    out = err = None
    if proc.stdout is not None and proc.stderr is not None:  # read, not waited: the watcher reaps
        errs: list[str] = []
        reader = threading.Thread(target=lambda: errs.append(proc.stderr.read()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        out = proc.stdout.read()
        reader.join()
        err = errs[0] if errs else ""
    code, _ = watched.reap()
    return subprocess.CompletedProcess(cmd, code, out, err)


def python_path() -> str:
    """The repository first, then whatever PYTHONPATH this script was given (site packages kept
    beside the system's, as on a node whose image lacks some)."""
    return os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)


def reference_step(device: str, timeout_s: float) -> dict[str, float]:
    """The node's reference step on one device, as the agent runs it at registration (bf16)."""
    env = dict(
        os.environ, CUDA_VISIBLE_DEVICES=device, CUDA_DEVICE_ORDER="PCI_BUS_ID", PYTHONPATH=python_path()
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
           "-m", "training.reference_step", "--device", "cuda", "--precisions", "bf16"]  # fmt: skip
    out = run_kept(cmd, env, timeout_s, capture=True)
    for line in out.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX) :])["rates"]["bf16"]
    raise RuntimeError(f"reference step failed (exit {out.returncode}): {out.stderr[-2000:]}")


def train(args: argparse.Namespace, n_gpus: int, out: Path) -> list[dict[str, Any]]:
    """Every rank's figures from a torchrun group of ``n_gpus`` running ``worker``."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n_gpus),
           str(Path(__file__).resolve()), "--worker", "--out", str(out), "--tp", str(args.tp),
           "--dp", str(args.dp), "--zero", str(args.zero), "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--local-batch", str(args.local_batch),
           "--micro-batch", str(args.micro_batch), "--device", args.device,
           "--model-json", args.model_json]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=python_path(), CUDA_DEVICE_ORDER="PCI_BUS_ID")
    done = run_kept(cmd, env, args.timeout_s, capture=False)
    if done.returncode != 0:
        raise RuntimeError(f"training ranks failed (exit {done.returncode})")
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(n_gpus)]


def planner_estimates(
    args: argparse.Namespace, ref: dict[str, float], link_gbytes_s: float | None
) -> dict[str, float]:
    """The planner's memory per device and step time for this layout on this node: its reference
    rate and fixed costs, its NVML link figure for TP and the gradient all-reduce."""
    from contracts.job_spec import JobSpec
    from control_layer.planner import cost_model as cm
    from control_layer.planner.local_step import host_parts
    from control_layer.planner.snapshot import LOCAL_BANDWIDTH_GBPS, LOCAL_LATENCY_MS, StepRateInfo

    spec = JobSpec(
        name="gpu-validate",
        model=MODEL,
        training={
            "steps": args.steps,
            "global_batch_tokens": args.dp * args.local_batch * MODEL["seq_len"],
            "micro_batch_size": args.micro_batch,
            "precision": "bf16",
        },
        parallelism={"dp": args.dp, "tp": args.tp, "pp": 1},
    )
    n_micro = args.local_batch // args.micro_batch
    memory = cm.memory_per_device(spec, args.tp, 1, args.zero, args.dp, n_micro, "1f1b")
    bw = (link_gbytes_s * 1e9) if link_gbytes_s else LOCAL_BANDWIDTH_GBPS * 1e9 / 8
    lat = LOCAL_LATENCY_MS / 1000.0
    flops = ref["tflops"] * 1e12
    step = cm.replica_time(spec, args.tp, 1, args.zero, n_micro, args.dp, flops, bw, lat, bw, lat,
                           micro_batch_s=ref["micro_batch_s"], step_s=ref["step_s"])  # fmt: skip
    data_s, optimizer_s = host_parts(StepRateInfo(**ref), spec, args.tp, 1, args.zero, args.dp, n_micro)
    parts = {"replica_s": float(step.total), "data_s": data_s, "optimizer_s": optimizer_s}
    return {"memory_bytes": memory.total, "step_s": sum(parts.values()), "parts_s": parts}


def report(args: argparse.Namespace, name: str, n_gpus: int, links: dict[str, Any], ref: dict[str, float],
           ranks: list[dict[str, Any]], est: dict[str, float]) -> dict[str, Any]:  # fmt: skip
    from contracts.model import GPTConfig, gpt_param_count, train_flops_per_token

    cfg = GPTConfig(**MODEL)
    step_s = max(r["step_s"] for r in ranks)
    tokens = args.dp * args.local_batch * cfg.seq_len
    per_gpu = train_flops_per_token(cfg) * tokens / step_s / n_gpus / 1e12
    peak = peak_tflops(name)
    memory = [
        {"rank": r["rank"], "estimate_gb": round(est["memory_bytes"] / 1e9, 3),
         "measured_gb": round(r["max_memory_allocated"] / 1e9, 3),
         "rel_err": rel_err(est["memory_bytes"], r["max_memory_allocated"])}
        for r in sorted(ranks, key=lambda r: r["rank"])
    ]  # fmt: skip
    busbw = ranks[0]["busbw_gbytes_s"]
    link = links["link_gbytes_s"]
    out = {
        "cuda": True,
        "device": name,
        "gpus": n_gpus,
        "tp": args.tp,
        "dp": args.dp,
        "zero": args.zero,
        "params": gpt_param_count(cfg),
        "steps": args.steps,
        "step_s": round(step_s, 5),
        "tokens_per_s": round(tokens / step_s, 1),
        "training_tflops_per_gpu": round(per_gpu, 2),
        "peak_tflops": peak,
        "mfu": round(per_gpu / peak, 4) if peak else None,
        "memory": memory,
        "max_abs_memory_rel_err": max(
            (abs(m["rel_err"]) for m in memory if m["rel_err"] is not None), default=None
        ),
        "step_estimate_s": round(est["step_s"], 5),
        "step_estimate_parts_s": {k: round(v, 5) for k, v in est["parts_s"].items()},
        "reference": {k: round(v, 6) for k, v in ref.items()},
        "step_rel_err": rel_err(est["step_s"], step_s),
        "allreduce_busbw_gbytes_s": round(busbw, 2) if busbw else None,
        "link": links["link"],
        "link_gbytes_s": link,
        "busbw_over_link": round(busbw / link, 3) if busbw and link else None,
        "reference_tflops": round(ref["tflops"], 2),
        "training_over_reference": round(per_gpu / ref["tflops"], 3),
        "data_s": round(statistics.median(r["data_s"] for r in ranks), 5),
        "step_parts_s": {k: round(statistics.median(r["parts_s"][k] for r in ranks), 5) for k in STEP_PARTS},
        "loss_first_last": [ranks[0]["loss_first"], ranks[0]["loss_last"]],
    }
    mem_err, step_err = out["max_abs_memory_rel_err"], out["step_rel_err"]
    out["targets_met"] = {
        "mfu": out["mfu"] is not None and out["mfu"] >= TARGETS["mfu"],
        "memory": mem_err is not None and mem_err <= TARGETS["memory_rel_err"],
        "step_time": step_err is not None and abs(step_err) <= TARGETS["step_rel_err"],
    }
    return out


def print_table(r: dict[str, Any]) -> None:
    rows = [
        ("device", f"{r['gpus']} x {r['device']}"),
        (
            "layout",
            f"tp {r['tp']} x dp {r['dp']} (FSDP2, ZeRO-{r['zero']}), {r['params'] / 1e9:.2f}B params, bf16",
        ),
        (
            "step",
            f"{r['step_s']:.4f} s measured, {r['step_estimate_s']:.4f} s estimated"
            f" (relative error {r['step_rel_err']})",
        ),
        ("MFU", f"{r['mfu']:.1%} of {r['peak_tflops']} TFLOPS" if r["mfu"] is not None else "peak unknown"),
        ("TFLOPS/GPU", f"{r['training_tflops_per_gpu']} training, {r['reference_tflops']} reference step"),
        ("all-reduce", f"{r['allreduce_busbw_gbytes_s']} GB/s bus, {r['link']} {r['link_gbytes_s']} GB/s"),
    ]
    rows += [(f"memory rank {m['rank']}", f"{m['measured_gb']} GB measured, {m['estimate_gb']} GB estimated "
              f"({m['rel_err']})") for m in r["memory"]]  # fmt: skip
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--tp", type=int, default=None)
    p.add_argument("--dp", type=int, default=None, help=argparse.SUPPRESS)  # set for --worker
    p.add_argument("--zero", type=int, choices=(1, 2, 3), default=2, help="FSDP2's ZeRO stage")
    p.add_argument("--local-batch", type=int, default=8, help="sequences per replica per step")
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--timeout-s", type=float, default=1800.0)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    # The ranks' own code path on CPU (gloo) with a small model: tests/benchmarks/test_gpu_validate.py.
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help=argparse.SUPPRESS)
    p.add_argument("--model-json", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        why = f"no CUDA device here (torch {torch.__version__}, CUDA build {torch.version.cuda})"
        print(f"gpu_validate: {why}; nothing to measure")
        print(json.dumps({"cuda": False, "reason": why}))
        return 0
    if args.local_batch % args.micro_batch:
        raise SystemExit("gpu_validate: --local-batch must be a multiple of --micro-batch")
    n_gpus = torch.cuda.device_count()
    args.tp, args.dp = layout(n_gpus, args.tp)
    name = torch.cuda.get_device_name(0)
    links = node_links()
    ref = reference_step(links["uuids"][0] if links["uuids"] else "0", args.timeout_s)
    with tempfile.TemporaryDirectory(prefix="cpn-gpu-validate-") as tmp:
        ranks = train(args, n_gpus, Path(tmp))
    est = planner_estimates(args, ref, links["link_gbytes_s"])
    result = report(args, name, n_gpus, links, ref, ranks, est)
    print_table(result)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
