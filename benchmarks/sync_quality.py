"""Cross-region sync semantics on kernel-shaped links: what each mode's final model is worth.

    python benchmarks/sync_quality.py [--steps 300] [--quick] [--only MODE...] [--workloads NAME...]

3 regions in network namespaces (benchmarks/netlab.py: veth through a bridge, tc tbf 100 Mbit/s
on both ends; no latency emulation), each one real worker process (``python -m training.worker``)
with the sync section the control plane builds (listen/advertise on the region's address, peers
by address, the ring order, kernel shaping). Three workloads (``WORKLOADS``), equal tokens per mode,
AdamW lr 1e-3: the WAN workload (a 4-layer GPT of 1.34M parameters over a 256-token Markov
language, 8 x 128 tokens per region per step), a 6-layer one over 512 tokens and a wider 2-layer
one over 128 tokens (each its own Markov language). The first runs every mode; the others the
H=20 rows the worst-workload figures compare.

Figures: held-out loss of the final model (every region's, averaged; 16 x 64 sequences from a
generator no training stream uses), utilisation (compute time / train-loop wall time, per region,
from the metrics), WAN bytes (the veth counters, and the workers' own count). Checks:
- ``sync`` for 20 steps against one process training on the combined batch (an independent loop
  written here): relative parameter difference over the whole model (``--no-check`` skips it);
- ``sync`` replicas bit-identical at the end (final checkpoints compared);
- gossip's final spread: the largest parameter difference between regions' final checkpoints;
- DiLoCo int8 + overlap at H=20, and streaming DiLoCo (5 fragments) int8 + overlap at H=100, each
  over blocking fp32 DiLoCo at the same H. Overlapped rows land each round after the delay the
  control plane gives, with the merge it gives for that delay (``with_delay``);
- per workload, ``diloco H20 auto``: the codec and overlap the planner picks from the workload's
  own calibration (``training/calibration.py``, what ``cpn calibrate`` runs; a row already run
  with exactly those settings is reused), over fp32 blocking; the worst ratio over workloads of
  it and of int8 + overlap.
Workloads can run side by side, each in its own namespaces (``--lab 0|1|2``); ``--combine`` merges
their final JSON lines. Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _wan_workload import (  # noqa: E402
    BATCH,
    DATA,
    LINK_MBIT,
    LR,
    MODEL,
    QUICK_BATCH,
    QUICK_MODEL,
    REGIONS,
    SEED,
    WARMUP,
)
from netlab import NetLab, netns_available  # noqa: E402
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save  # noqa: E402

from contracts.job_spec import JobSpec  # noqa: E402
from contracts.metrics import METRIC_PREFIX, RESULT_PREFIX, parse_lines  # noqa: E402
from contracts.model import GPTConfig  # noqa: E402
from contracts.sync_delay import overlap_merge_for  # noqa: E402
from contracts.worker_config import parse_worker_config  # noqa: E402
from control_layer.planner.calibrated import overlap_allowed  # noqa: E402
from control_layer.planner.sync_choice import choose_compression  # noqa: E402
from control_layer.planner.sync_settings import overlap_delay, payload_bytes  # noqa: E402
from training.calibration import calibrate, candidates_for, slice_for  # noqa: E402
from training.checkpoint import latest_checkpoint  # noqa: E402
from training.data.markov import MarkovSource  # noqa: E402
from training.data.streams import build_stream  # noqa: E402
from training.models.gpt import GPT  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SUBNET, PREFIX, PORT = "10.213.21", "cpnsq", 29700


def modes() -> list[tuple[str, dict[str, Any]]]:
    """Overlapped rows get their delay and merge from the control plane (``overlap_delay`` and
    ``overlap_merge_for``, in ``with_delay``); the ``mix`` row keeps Streaming DiLoCo's merge
    whatever the delay (what real jobs got before the merge followed the delay). ``auto`` rows
    are added per workload from its calibration (``auto_row``). Every row runs the same steps in
    every region (no balanced rounds) and says whether it overlaps."""
    fixed = {"balance": False}
    blocking = {"overlap": False, **fixed}
    int8 = {"compression": "int8", "overlap": True, **fixed}
    stream = {"fragments": 5, **int8}
    return [
        ("diloco H20 fp32", {"mode": "diloco", "every": 20, **blocking}),
        ("diloco H20 int8 overlap", {"mode": "diloco", "every": 20, **int8}),
        ("diloco H20 int8 overlap mix", {"mode": "diloco", "every": 20, **int8, "overlap_merge": "mix"}),
        ("diloco H100 fp32", {"mode": "diloco", "every": 100, **blocking}),
        ("diloco H100 stream int8", {"mode": "diloco", "every": 100, **stream}),
        ("local_sgd H20", {"mode": "local_sgd", "every": 20, **fixed}),
        ("gossip", {"mode": "gossip", "every": 10}),
        ("sync", {"mode": "sync"}),
    ]  # fmt: skip


# The workloads the H=20 rows run on: the WAN workload, then a deeper model over a larger
# vocabulary, and a wider, shallower one over a smaller one, each on its own Markov language.
# Only the first runs every mode; the others the rows the worst-workload figures compare.
WORKLOADS: dict[str, tuple[dict, dict, int]] = {
    "gpt4-v256": (MODEL, DATA, BATCH),
    "gpt6-v512": ({"n_layers": 6, "d_model": 96, "n_heads": 4, "vocab": 512, "seq_len": 128},
                  {"kind": "synthetic-markov", "seed": 11}, 8),
    "gpt2w-v128": ({"n_layers": 2, "d_model": 192, "n_heads": 6, "vocab": 128, "seq_len": 64},
                   {"kind": "synthetic-markov", "seed": 5}, 16),
}  # fmt: skip
QUICK_WORKLOADS: dict[str, tuple[dict, dict, int]] = {
    "gpt4-v256": (QUICK_MODEL, DATA, QUICK_BATCH),
    "gpt1-v64": ({**QUICK_MODEL, "n_layers": 1, "vocab": 64}, {"kind": "synthetic-markov", "seed": 11}, 4),
}
H20_ROWS = ("diloco H20 fp32", "diloco H20 int8 overlap")


def with_delay(sync: dict[str, Any], model: dict, step_s: float) -> dict[str, Any]:
    """The control plane's delay and merge for an overlapped row (``planner.sync_settings``):
    the exchange of this payload over the 100 Mbit/s ring against the regions' measured local step."""
    if not sync.get("overlap") or "overlap_steps" in sync:
        return sync
    n_params = sum(p.numel() for p in GPT(GPTConfig(**model)).parameters())
    payload = payload_bytes(n_params, sync.get("compression", "none"), 0.01) / sync.get("fragments", 1)
    round_steps = sync["every"] // sync.get("fragments", 1)
    delay = int(overlap_delay(round_steps, payload, len(REGIONS), LINK_MBIT * 1e6, 0.0, step_s))
    merge = sync.get("overlap_merge") or overlap_merge_for(delay, round_steps)
    return {**sync, "overlap_steps": delay, "overlap_merge": merge}


def job_spec(model: dict, data: dict, batch: int, steps: int) -> JobSpec:
    """The job a workload is: what ``cpn calibrate`` reads (the workers below get the same)."""
    body = {
        "name": "sync-quality",
        "model": model,
        "data": data,
        "training": {"steps": steps, "global_batch_tokens": batch * model["seq_len"] * len(REGIONS),
                     "lr": LR, "warmup_steps": WARMUP, "grad_clip": 0, "seed": SEED},
        "sync": {"mode": "diloco", "every": 20},
    }  # fmt: skip
    return JobSpec.model_validate(body)


def auto_row(model: dict, data: dict, batch: int, steps: int, budget_s: float) -> tuple[dict, dict]:
    """The codec and overlap the planner picks for the workload from its calibration (the code
    ``cpn calibrate`` runs, then ``planner.sync_choice``), as an H=20 row; and what was measured."""
    sl = slice_for(job_spec(model, data, batch, steps), regions=len(REGIONS), every=20)
    cal = calibrate(sl, candidates_for(sl.every), budget_s=budget_s, stop_at_pass=True)
    codec, why = choose_compression("diloco", cal)
    overlap = overlap_allowed("diloco", codec, cal)
    sync = {"mode": "diloco", "every": 20, "compression": codec, "overlap": overlap, "balance": False}
    trials = [] if cal is None else [t.model_dump() for t in cal.trials]
    return sync, {"codec": codec, "overlap": overlap, "why": why, "trials": trials,
                  "seconds": None if cal is None else cal.seconds}  # fmt: skip


def configs(
    model: dict, batch: int, steps: int, sync: dict, lab: NetLab, wd: Path, data: dict = DATA
) -> dict[str, dict]:
    """What the control plane gives each region's worker (control_layer.worker_config)."""
    addr = {r: f"{lab.regions[r].ip}:{PORT}" for r in REGIONS}
    out = {}
    for i, r in enumerate(REGIONS):
        out[r] = {
            "job_id": "sync-quality",
            "region": r,
            "cluster": f"{r}-c0",
            "model": model,
            "data": data,
            "training": {"steps": steps, "local_batch": batch, "lr": LR, "warmup": WARMUP, "seed": SEED},
            "metrics_path": str(wd / r / "metrics.jsonl"),
            "checkpoint": {"dir": str(wd / r / "ckpt"), "resume": False},
            "device": "cpu",
            "sync": {
                **sync,
                "region": r,
                "listen": addr[r],
                "advertise": addr[r],
                "peers": {p: a for p, a in addr.items() if p != r},
                "ring_order": REGIONS,
                "kernel_shaping": True,
                "insecure": True,  # the lab's namespaces on this host, without the job's TLS material
                "global_replicas": len(REGIONS),
                "replica_offset": i,
                "timeout_s": 120.0,
                "startup_timeout_s": 300.0,
            },
        }
    return out


def final_state(ckpt: Path, tmp: Path) -> dict[str, torch.Tensor]:
    path = latest_checkpoint(ckpt)
    if path is None:
        raise RuntimeError(f"no checkpoint under {ckpt}")
    out = tmp / "final.pt"
    dcp_to_torch_save(str(path), str(out))
    return torch.load(out, weights_only=False)["model"]


def held_out_loss(model_cfg: dict, data: dict, state: dict[str, torch.Tensor], batches: int = 16) -> float:
    model = GPT(GPTConfig(**model_cfg))
    model.load_state_dict(state)
    model.eval()
    src = MarkovSource(model_cfg["vocab"], data["seed"])
    gen = torch.Generator().manual_seed(12345)  # held out: no training stream uses this generator
    total = 0.0
    with torch.no_grad():
        for _ in range(batches):
            x = src.sample(64, model_cfg["seq_len"] + 1, gen)
            total += float(model(x[:, :-1], x[:, 1:])[1])
    return total / batches


def run(name: str, cfgs: dict[str, dict], lab: NetLab, wd: Path, timeout: float) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    before = lab.counters()
    t0 = time.monotonic()
    procs = {}
    for r, cfg in cfgs.items():
        d = wd / r
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps(cfg))
        argv = [sys.executable, "-m", "training.worker", "--config", str(d / "config.json")]
        procs[r] = lab.popen(r, argv, log=d / "worker.log", env=env, cwd=REPO)
    try:
        for p in procs.values():
            p.wait(timeout=max(1.0, timeout - (time.monotonic() - t0)))
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    elapsed = time.monotonic() - t0
    after = lab.counters()
    steps = next(iter(cfgs.values()))["training"]["steps"]
    metrics, states = {}, {}
    for r in REGIONS:
        text = (wd / r / "worker.log").read_text()
        m = parse_lines(text, METRIC_PREFIX)
        if not parse_lines(text, RESULT_PREFIX) or len(m) != steps:
            raise RuntimeError(f"{name}/{r} did not finish:\n{text[-3000:]}")
        metrics[r] = m
        states[r] = final_state(wd / r / "ckpt", wd / r)
    timed = {r: [x for x in m if x["step"] > 1] for r, m in metrics.items()}  # step 1 waits for all
    util = {r: sum(x["compute_s"] for x in t) / sum(x["wall_s"] for x in t) for r, t in timed.items()}
    first = next(iter(cfgs.values()))
    losses = [held_out_loss(first["model"], first["data"], states[r]) for r in REGIONS]
    spread = max(
        float((states[a][n] - states[b][n]).abs().max()) for a in REGIONS for b in REGIONS for n in states[a]
    )
    local = sorted(x["data_s"] + x["compute_s"] + x["optimizer_s"] for t in timed.values() for x in t)
    blocked = [x.get("sync", {}).get("blocked_s", 0.0) for t in timed.values() for x in t]
    return {
        "mode": name,
        "elapsed_s": elapsed,
        "local_step_s": local[len(local) // 2],  # median: data, forward/backward, optimizer
        "sync_wait_s": sum(blocked) / max(1, len(blocked)),
        "loss": sum(losses) / len(losses),
        "utilization": min(util.values()),
        "wan_bytes_veth": sum(after[r][0] - before[r][0] for r in REGIONS),
        "wan_bytes_metrics": sum(
            sum(x.get("sync", {}).get("bytes_sent", {}).values()) for m in metrics.values() for x in m
        ),
        "final_spread": spread,
        "identical": spread == 0.0,
        "states": states,
        "gossip_spread": [x["gossip_spread"] for x in metrics[REGIONS[0]] if "gossip_spread" in x],
    }


def single_process(cfg: dict, steps: int) -> dict[str, torch.Tensor]:
    """The combined batch of every region's replica, one process, one AdamW step per step."""
    wc = parse_worker_config(cfg)
    assert wc.model is not None
    model = GPT(wc.model, seed=wc.training.seed)
    t = wc.training
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": t.weight_decay}, {"params": rest, "weight_decay": 0.0}],
        lr=t.lr,
        betas=t.betas,
    )

    def lr_at(s: int) -> float:  # linear warmup, cosine to min_lr_ratio
        if s < t.warmup:
            return (s + 1) / t.warmup
        prog = min(1.0, (s - t.warmup) / max(1, steps - t.warmup))
        return t.min_lr_ratio + (1 - t.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * prog))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    streams = [
        build_stream(wc.data, worker_region=r, vocab=wc.model.vocab, seq_len=wc.model.seq_len, replica=i,
                     replicas=len(REGIONS))
        for i, r in enumerate(REGIONS)
    ]  # fmt: skip
    for step in range(1, steps + 1):
        xs, ys = zip(*(s.batch(step, wc.local_batch) for s in streams), strict=True)
        _, loss = model(torch.cat(xs), torch.cat(ys))
        loss.backward()
        if t.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def check_sync(model: dict, batch: int, steps: int, lab: NetLab, root: Path) -> tuple[float, dict[str, Any]]:
    """``sync`` for 20 steps against one process on the combined batch: relative difference."""
    check_steps = min(20, steps)
    cfgs = configs(model, batch, check_steps, {"mode": "sync"}, lab, root / "check")
    check = run("sync (20 steps)", cfgs, lab, root / "check", 1800)
    want = single_process(cfgs[REGIONS[0]], check_steps)
    got, ref = check["states"][REGIONS[1]], want
    num = sum(float((got[n] - ref[n]).pow(2).sum()) for n in ref) ** 0.5
    den = sum(float(ref[n].pow(2).sum()) for n in ref) ** 0.5
    print(f"sync vs one process after {check_steps} steps: relative difference {num / den:.3e}", flush=True)
    return num / den, check


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return {"compression": "none", **a} == {"compression": "none", **b}


def run_workload(
    wl: str, spec: tuple[dict, dict, int], rows_of: list[tuple[str, dict]], args: argparse.Namespace,
    lab: NetLab, root: Path, step_s: float,
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:  # fmt: skip
    """Every row of one workload; the auto row from its calibration (reusing a row run already
    where the planner picked exactly its settings)."""
    model, data, batch = spec
    auto_sync, auto = auto_row(model, data, batch, args.steps, args.calibration_budget_s)
    print(f"{wl}: calibration {auto['trials']} -> {auto['codec']} overlap={auto['overlap']} "
          f"({auto['seconds'] or 0:.0f} s): {auto['why']}", flush=True)  # fmt: skip
    rows: dict[str, dict[str, Any]] = {}
    given: dict[str, dict[str, Any]] = {}
    for name, sync in [*rows_of, ("diloco H20 auto", auto_sync)]:
        if args.only and name not in args.only:
            continue
        if "diloco H20 fp32" in rows:  # this workload's own local step sets the delay
            step_s = rows["diloco H20 fp32"]["local_step_s"]
        sync = with_delay(sync, model, step_s)
        twin = next((n for n, g in given.items() if _same(g, sync)), None)
        given[name] = sync
        if twin is not None:
            rows[name] = {**rows[twin], "mode": name, "same_as": twin}
            print(f"{wl} {name}: the same settings as {twin}", flush=True)
            continue
        wd = root / wl / name.replace(" ", "_")
        rows[name] = run(name, configs(model, batch, args.steps, sync, lab, wd, data), lab, wd, 7200)
        r = rows[name]
        r["delay"], r["merge"] = sync.get("overlap_steps"), sync.get("overlap_merge")
        print(f"{wl} {name}: loss {r['loss']:.4f} util {r['utilization']:.3f} veth {r['wan_bytes_veth']} "
              f"spread {r['final_spread']:.3g} delay {r['delay']} {r['merge'] or ''} "
              f"wait {r['sync_wait_s']:.4f} s/step ({r['elapsed_s']:.0f} s)", flush=True)  # fmt: skip
    return rows, auto


def print_table(results: dict[str, dict[str, dict[str, Any]]]) -> None:
    print()
    print("| workload | mode | delay | held-out loss | utilisation | sync wait s/step | WAN MB (veth) "
          "| WAN MB (metrics) | final spread |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for wl, rows in results.items():
        for r in rows.values():
            delay = f"{r['delay']} {r['merge']}" if r.get("delay") else "-"
            name = r["mode"] + (f" (= {r['same_as']})" if r.get("same_as") else "")
            print(f"| {wl} | {name} | {delay} | {r['loss']:.4f} | {r['utilization']:.3f} | "
                  f"{r['sync_wait_s']:.4f} | {r['wan_bytes_veth'] / 1e6:.2f} | "
                  f"{r['wan_bytes_metrics'] / 1e6:.2f} | {r['final_spread']:.3g} |")  # fmt: skip


def ratio(rows: dict[str, dict[str, Any]], a: str, b: str) -> float | None:
    return rows[a]["loss"] / rows[b]["loss"] if a in rows and b in rows else None


def worst(results: dict[str, dict[str, dict[str, Any]]], row: str) -> float | None:
    got = [x for rows in results.values() if (x := ratio(rows, row, "diloco H20 fp32")) is not None]
    return max(got) if got else None


def combine(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One summary from runs of disjoint workloads side by side (``--lab``): the first's own
    figures, every workload's, and the worst ratios over all of them."""
    out = {**parts[0], "per_workload": {}}
    for p in parts:
        out["per_workload"].update(p["per_workload"])
    for key, row in (("worst_workload_int8_overlap_h20_loss_ratio", "int8_overlap_h20_loss_ratio"),
                     ("worst_workload_auto_choice_loss_ratio", "auto_choice_loss_ratio")):  # fmt: skip
        got = [w[row] for w in out["per_workload"].values() if w[row] is not None]
        out[key] = max(got) if got else None
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--quick", action="store_true", help="tiny models and batches: checks the script")
    ap.add_argument("--only", nargs="*", help="run only these modes (names as in the table)")
    ap.add_argument("--workloads", nargs="*", help="run only these workloads (default: all)")
    ap.add_argument("--calibration-budget-s", type=float, default=1800.0, help="per workload")
    ap.add_argument(
        "--lab", type=int, default=0, choices=range(3), help="namespaces/subnet: runs side by side"
    )
    ap.add_argument("--no-check", action="store_true", help="skip sync against one process")
    ap.add_argument("--combine", nargs="*", help="merge the final JSON of runs side by side (files)")
    args = ap.parse_args()
    if args.combine:
        print(
            json.dumps(
                combine([json.loads(Path(f).read_text().strip().splitlines()[-1]) for f in args.combine])
            )
        )
        return 0
    torch.set_num_threads(1)  # the calibration and the held-out losses: two threads on a loaded host crawl
    why = netns_available()
    if why:
        print(f"needs network namespaces: {why}", file=sys.stderr)
        return 2
    workloads = QUICK_WORKLOADS if args.quick else WORKLOADS
    chosen = {k: v for k, v in workloads.items() if not args.workloads or k in args.workloads}
    results: dict[str, dict[str, dict[str, Any]]] = {}
    autos: dict[str, dict[str, Any]] = {}
    first_model, _, first_batch = next(iter(workloads.values()))
    with (
        tempfile.TemporaryDirectory() as tmp,
        NetLab(
            REGIONS, LINK_MBIT, prefix=f"{PREFIX}{args.lab or ''}", subnet=f"10.213.{21 + args.lab}"
        ) as lab,
    ):
        root = Path(tmp)
        print(lab.describe(), flush=True)
        rel, check = None, {"identical": None, "local_step_s": math.nan}
        if not args.no_check:
            rel, check = check_sync(first_model, first_batch, args.steps, lab, root)
            print(f"local step {check['local_step_s']:.3f} s (median of the check run)", flush=True)
        step_s = check["local_step_s"]
        for wl, spec in chosen.items():
            rows_of = modes() if wl == next(iter(workloads)) else [m for m in modes() if m[0] in H20_ROWS]
            results[wl], autos[wl] = run_workload(wl, spec, rows_of, args, lab, root, step_s)
    print_table(results)
    main_rows = results.get(next(iter(workloads)), {})
    summary = {
        "sync_vs_single_process_max_rel_diff": rel,
        "sync_replicas_identical": main_rows["sync"]["identical"]
        if "sync" in main_rows
        else check["identical"],
        "gossip_final_spread": main_rows["gossip"]["final_spread"] if "gossip" in main_rows else None,
        "diloco_int8_overlap_h20_loss_ratio": ratio(main_rows, "diloco H20 int8 overlap", "diloco H20 fp32"),
        "diloco_stream_int8_h100_loss_ratio": ratio(main_rows, "diloco H100 stream int8", "diloco H100 fp32"),
        "diloco_int8_overlap_mix_h20_loss_ratio": ratio(
            main_rows, "diloco H20 int8 overlap mix", "diloco H20 fp32"
        ),
        "per_workload": {
            wl: {
                "int8_overlap_h20_loss_ratio": ratio(rows, "diloco H20 int8 overlap", "diloco H20 fp32"),
                "auto_choice_loss_ratio": ratio(rows, "diloco H20 auto", "diloco H20 fp32"),
                "auto_choice": {k: autos[wl][k] for k in ("codec", "overlap")},
                "calibration": autos[wl]["trials"],
                "calibration_s": autos[wl]["seconds"],
            }
            for wl, rows in results.items()
        },
        "worst_workload_int8_overlap_h20_loss_ratio": worst(results, "diloco H20 int8 overlap"),
        "worst_workload_auto_choice_loss_ratio": worst(results, "diloco H20 auto"),
        "local_step_s": round(step_s, 4) if math.isfinite(step_s) else None,
        "steps": args.steps,
        "quick": args.quick,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
