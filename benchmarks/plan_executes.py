"""What is quoted is what runs: every option plan() returns passes the executor and the worker.

    python benchmarks/plan_executes.py [--pairs 520] [--runs 20] [--seed 0]

Draws random (job spec, fleet) pairs (GPU fleets with models up to billions of parameters, and
CPU fleets with tiny models), plans each, and for EVERY returned option builds the worker configs
exactly as placement does (one TaskSlot per node, sync ports when the job has several nodes),
then validates each with the worker's own checks: ``contracts.worker_config.WorkerConfig`` and
the runtime's startup checks (``training.parallel.dims.ParallelDims`` for the mesh and the model
split, the bring-your-own limits). It counts the parameters of the module the worker builds (on
the meta device) against ``spec.model.n_params``, and each pipeline stage's against the cost
model's. Then it launches a sample of CPU options for real: one ``torchrun`` per node of the
option on local gloo processes, 2 steps, several nodes syncing over loopback gRPC. Prints a
table, then one final JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from pydantic import ValidationError  # noqa: E402

from agent.workers import rendezvous_args, resolve_checkpoint_dir  # noqa: E402
from contracts.errors import CpnError, NoFeasiblePlan  # noqa: E402
from contracts.job_spec import JobSpec  # noqa: E402
from contracts.lifetime import keeper_command  # noqa: E402
from contracts.model import model_config  # noqa: E402
from contracts.worker_config import WorkerConfig  # noqa: E402
from control_layer.allocation import add_job_credentials  # noqa: E402
from control_layer.planner import cost_model as cm  # noqa: E402
from control_layer.planner import plan  # noqa: E402
from control_layer.planner.node_groups import node_groups  # noqa: E402
from control_layer.planner.plan_types import PlanOption  # noqa: E402
from control_layer.planner.snapshot import ResourceSnapshot  # noqa: E402
from control_layer.worker_config import (  # noqa: E402
    TaskSlot,
    build_worker_configs,
    group_by_node,
    job_sync_secret,
    stage_port_counts,
    validate_worker_config,
)
from training.models.gpt import GPT  # noqa: E402
from training.parallel.dims import ParallelDims  # noqa: E402
from training.parallel.pipeline import split_stage  # noqa: E402

BYO_ENTRYPOINT = "plan_executes_byo:build"
# A 2-step run takes seconds; one this slow waited out a peer (the sync startup timeout).
SLOW_RUN_S = 60
GPUS = [("H100", 80.0, 700.0, 3.2), ("A100-40GB", 40.0, 280.0, 1.4), ("L4", 24.0, 110.0, 0.6)]
# name-free GPT shapes: (n_layers, d_model, n_heads, seq_len)
BIG_MODELS = [(4, 256, 4, 256), (12, 768, 12, 1024), (24, 2048, 16, 2048), (32, 4096, 32, 2048)]


# ------------------------------------------------------------------ random inputs


def _choice(rng: np.random.Generator, items: list) -> Any:
    return items[int(rng.integers(len(items)))]


def cpu_fleet(rng: np.random.Generator) -> ResourceSnapshot:
    """1-2 regions, 1-3 clusters, nodes of 1-2 CPU slots: at most a handful of local processes."""
    regions = [f"r{i}" for i in range(int(rng.integers(1, 3)))]
    clusters = []
    for i in range(int(rng.integers(1, 4))):
        nodes = [
            {
                "id": f"c{i}n{j}",
                "devices": [
                    {"index": k, "model": "cpu", "memory_gb": 4.0, "tflops": 0.05}
                    for k in range(int(rng.integers(1, 3)))
                ],
            }
            for j in range(int(rng.integers(1, 3)))
        ]
        clusters.append(
            {
                "id": f"c{i}",
                "name": f"c{i}",
                "region": _choice(rng, regions),
                "nodes": nodes,
                "price_per_device_hour": float(_choice(rng, [0.01, 0.02, 0.05])),
            }
        )
    return _snapshot(rng, regions, clusters)


def gpu_fleet(rng: np.random.Generator) -> ResourceSnapshot:
    """1-3 regions, 1-5 clusters of 1-4 nodes of 1-8 GPUs, some busy or down."""
    regions = [f"r{i}" for i in range(int(rng.integers(1, 4)))]
    clusters = []
    for i in range(int(rng.integers(1, 6))):
        model, mem, tflops, price = _choice(rng, GPUS)
        per = int(_choice(rng, [1, 2, 4, 8]))
        nodes = []
        for j in range(int(rng.integers(1, 5))):
            busy = int(rng.integers(0, per)) if rng.random() < 0.3 else 0
            nodes.append(
                {
                    "id": f"c{i}n{j}",
                    "alive": bool(rng.random() < 0.9 or j == 0),
                    "devices": [
                        {"index": k, "model": model, "memory_gb": mem, "tflops": tflops, "free": k >= busy}
                        for k in range(per)
                    ],
                }
            )
        clusters.append(
            {
                "id": f"c{i}",
                "name": f"c{i}",
                "region": _choice(rng, regions),
                "nodes": nodes,
                "intra_bandwidth_gbps": float(_choice(rng, [50.0, 200.0, 400.0])),
                "price_per_device_hour": price * float(_choice(rng, [0.8, 1.0, 1.2])),
                "spot_price_per_device_hour": price * 0.5 if rng.random() < 0.3 else None,
            }
        )
    return _snapshot(rng, regions, clusters)


def _snapshot(rng: np.random.Generator, regions: list[str], clusters: list[dict]) -> ResourceSnapshot:
    links = [
        {
            "src": a,
            "dst": b,
            "bandwidth_gbps": float(_choice(rng, [1.0, 10.0, 50.0])),
            "latency_ms": float(_choice(rng, [5.0, 50.0, 150.0])),
            "egress_price_per_gb": float(_choice(rng, [0.0, 0.02, 0.08])),
        }
        for i, a in enumerate(regions)
        for b in regions[i + 1 :]
    ]
    return ResourceSnapshot.model_validate(
        {
            "regions": [{"name": r, "jurisdiction": "EU"} for r in regions],
            "clusters": clusters,
            "links": links,
        }
    )


def random_spec(rng: np.random.Generator, tiny: bool, regions: list[str]) -> JobSpec:
    """A valid job: tiny models for CPU fleets (they can really run), up to 7B for GPU fleets."""
    if tiny:
        heads = int(_choice(rng, [1, 2, 4]))
        model = {
            "n_layers": int(_choice(rng, [1, 2, 4])),
            "d_model": heads * int(_choice(rng, [8, 16])),
            "n_heads": heads,
            "vocab": int(_choice(rng, [64, 128])),
            "seq_len": int(_choice(rng, [8, 16])),
        }
        sequences, steps = int(_choice(rng, [2, 4, 8])), 2
    else:
        layers, d, heads, seq = _choice(rng, BIG_MODELS)
        model = {"n_layers": layers, "d_model": d, "n_heads": heads, "vocab": 50304, "seq_len": seq}
        sequences, steps = int(_choice(rng, [8, 16, 64, 256])), int(_choice(rng, [100, 1000, 10000]))
    micro = int(_choice(rng, [1, 1, 2]))
    if sequences % micro:
        micro = 1
    raw: dict[str, Any] = {
        "name": "bench",
        "model": model,
        "training": {
            "steps": steps,
            "global_batch_tokens": sequences * model["seq_len"],
            "micro_batch_size": micro,
            "precision": _choice(rng, ["auto", "auto", "bf16", "fp32"]),
            "activation_checkpointing": bool(rng.random() < 0.3),
        },
        "sync": {
            "mode": _choice(rng, ["sync", "ssp", "local_sgd", "diloco", "async", "gossip"]),
            "every": int(_choice(rng, [1, 2])) if tiny else int(_choice(rng, [1, 10, 100])),
            "compression": _choice(rng, ["none", "bf16", "int8", "topk"]),
        },
        "qos": {"objective": _choice(rng, ["cost", "time"]), "preemptible": bool(rng.random() < 0.3)},
    }
    if rng.random() < 0.15:
        raw["data"] = {"kind": "synthetic-markov", "seed": 1, "region": _choice(rng, regions)}
    byo = tiny and rng.random() < 0.2
    if byo:
        raw["entrypoint"] = BYO_ENTRYPOINT
        raw["training"]["activation_checkpointing"] = False  # the runtime recomputes the built-in GPT only
        if rng.random() < 0.5:
            raw["entrypoint_parallelism"] = ["dp", "zero"]
    pin = rng.random()
    if pin < 0.1:
        raw["parallelism"] = {"zero": int(_choice(rng, [0, 2, 3])) if not byo else 0}
    elif pin < 0.2 and not byo:
        raw["parallelism"] = {"pp": int(_choice(rng, [1, 2])), "pp_schedule": _choice(rng, ["1f1b", "gpipe"])}
    elif pin < 0.3 and not byo:
        raw["parallelism"] = {"tp": int(_choice(rng, [1, 2]))}
    return JobSpec.model_validate(raw)


# ------------------------------------------------------------------ the executor, as placement runs it


def task_slots(option: PlanOption, snap: ResourceSnapshot, port: Any) -> list[TaskSlot]:
    """One TaskSlot per node, as control_layer.allocation makes them: a sync port for each group's
    leader when the job has several groups, a rendezvous port for the leader of a group spanning
    nodes (``port()`` hands out a free one)."""
    by_node = group_by_node(option)
    clusters = {c.id: c for c in snap.clusters}
    groups = node_groups(option.tasks)
    multi = len(groups) > 1
    leads = {g[0]: len(g) > 1 for g in groups}
    staged = stage_port_counts(option, option.sync.mode)  # per-stage rings: a port per stage led
    slots = []
    for node_id, entries in by_node.items():
        cluster = clusters[entries[0].cluster]
        stage_ports = tuple(port() for _ in range(staged.get(node_id, 0)))
        sync_port = stage_ports[0] if stage_ports else port() if multi and node_id in leads else None
        slots.append(
            TaskSlot(
                node_id=node_id,
                cluster_id=cluster.id,
                cluster_name=cluster.name or cluster.id,
                region=cluster.region,
                host="127.0.0.1",
                sync_port=sync_port,
                entries=tuple(entries),
                group_port=port() if leads.get(node_id) else None,
                cross_cluster_host="127.0.0.1" if snap.nodes_by_id()[node_id].cross_cluster_groups else None,
                stage_ports=stage_ports,
            )
        )
    return slots


def group_devices(option: PlanOption) -> dict[str, int]:
    """Per node: the devices of the torchrun group it is part of (its world size)."""
    count = Counter(t.node for t in option.tasks)
    return {n: sum(count[m] for m in g) for g in node_groups(option.tasks) for n in g}


def runtime_checks(cfg: WorkerConfig, n_devices: int) -> None:
    """What ``training.runtime.build_trainer`` checks before it trains (ParallelDims, the model
    split, the bring-your-own limits), without starting processes."""
    p = cfg.parallel
    dims = ParallelDims(
        dp=p.dp_local,
        tp=p.tp,
        pp=p.pp,
        world_size=n_devices,
        zero=p.zero,
        pp_schedule=p.pp_schedule,
        microbatches=cfg.microbatches,
    )
    if cfg.entrypoint is not None:
        if dims.tp > 1 or dims.pp > 1:
            raise ValueError("a bring-your-own model supports data parallelism only (tp = pp = 1)")
    else:
        assert cfg.model is not None
        dims.check_model(cfg.model)


def check_option(job_id: str, spec: JobSpec, option: PlanOption, snap: ResourceSnapshot) -> str | None:
    """None when every task's config passes the executor and the worker; else the first reason."""
    ports = iter(range(20000, 30000))
    try:
        slots = task_slots(option, snap, lambda: next(ports))
        configs = build_worker_configs(job_id, spec, option, slots)
        replicas = 0
        world = group_devices(option)
        for slot in slots:
            cfg = WorkerConfig.model_validate(validate_worker_config(configs[slot.node_id]))
            runtime_checks(cfg, world[slot.node_id])
            if cfg.global_replicas != option.dp:
                return f"global_replicas {cfg.global_replicas} != dp {option.dp}"
            if cfg.training.precision != option.precision:
                return f"worker precision {cfg.training.precision} != priced {option.precision}"
            if cfg.group is None or cfg.group.node_rank == 0:  # a group's replicas counted once
                replicas += cfg.parallel.dp_local
        if replicas != option.dp:
            return f"tasks hold {replicas} replicas, option has dp={option.dp}"
    except (CpnError, ValidationError, ValueError, AssertionError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


# ------------------------------------------------------------------ parameter counts


def n_params_mismatches(specs: list[JobSpec], stages: set[tuple[Any, int]]) -> tuple[int, int]:
    """(mismatches, modules checked): whole models against spec.model.n_params, and every
    pipeline stage the options use against the cost model's fullest stage."""
    bad = checked = 0
    seen = set()
    with torch.device("meta"):
        for spec in specs:
            if spec.model in seen:
                continue
            seen.add(spec.model)
            built = sum(p.numel() for p in GPT(model_config(spec.model)).parameters())
            checked += 1
            bad += built != spec.model.n_params
        for model, pp in sorted(stages, key=lambda mp: (mp[0].n_layers, mp[0].d_model, mp[1])):
            sizes = [
                sum(p.numel() for p in split_stage(GPT(model_config(model)), s, pp).parameters())
                for s in range(pp)
            ]
            checked += 1
            bad += max(sizes) != cm.stage_params(model, 1, pp)
    return bad, checked


# ------------------------------------------------------------------ real runs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spans_nodes(option: PlanOption) -> bool:
    """Whether a replica of the option runs across nodes (one torchrun group over several)."""
    return any(len(g) > 1 for g in node_groups(option.tasks))


@dataclass
class Runnable:
    spec: JobSpec
    option: PlanOption
    snap: ResourceSnapshot

    @property
    def kind(self) -> tuple:
        o = self.option
        return (
            spans_nodes(o),
            len(group_by_node(o)) > 1,
            o.pp > 1,
            o.tp > 1,
            self.spec.entrypoint is not None,
            o.zero > 0,
            o.precision,
            o.activation_checkpointing,
        )


def pick_runs(candidates: list[Runnable], n: int, rng: np.random.Generator) -> list[Runnable]:
    """n options, round-robin over their kinds (nodes, pipeline, TP, BYO, ZeRO, precision, AC),
    the kinds that exercise the most features first."""
    by_kind: dict[tuple, list[Runnable]] = {}
    for c in candidates:
        by_kind.setdefault(c.kind, []).append(c)
    for items in by_kind.values():
        rng.shuffle(items)  # type: ignore[arg-type]
    order = sorted(by_kind, key=lambda k: (-sum(bool(f) for f in k if isinstance(f, bool)), k))
    out: list[Runnable] = []
    while len(out) < n and any(by_kind.values()):
        for kind in order:
            if by_kind[kind] and len(out) < n:
                out.append(by_kind[kind].pop())
    return out


def run_option(r: Runnable, workdir: Path, timeout_s: float) -> str | None:
    """Launch every task of the option (one torchrun per node, the nodes of a group spanning nodes
    meeting at its first), 2 steps; None when all finish."""
    slots = task_slots(r.option, r.snap, _free_port)
    # signed sync calls over TLS and authenticated group rendezvous, as the placer configures every real job
    secret = job_sync_secret("bench-server", "bench")
    configs = build_worker_configs("bench", r.spec, r.option, slots, sync_secret=secret)
    add_job_credentials(configs, "bench", secret)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(HERE)]),
        "OMP_NUM_THREADS": "1",
    }
    procs, reporting = [], []
    for i, slot in enumerate(slots):
        path = workdir / f"worker{i}.json"
        # as the node's agent does: checkpoints under its own work dir
        cfg = resolve_checkpoint_dir(
            {**validate_worker_config(configs[slot.node_id]), "device": "cpu"}, workdir / f"node{i}"
        )
        path.write_text(json.dumps(cfg))
        reporting.append(not cfg.get("group") or cfg["group"]["node_rank"] == 0)
        launcher, rendezvous = rendezvous_args(cfg.get("group"), "bench")
        cmd = [sys.executable, "-m", launcher, *rendezvous,
               "--nproc-per-node", str(len(slot.device_indices)),
               "-m", "training.worker", "--config", str(path)]  # fmt: skip
        kept, fds = keeper_command(cmd, grace_s=0)  # a timeout, or our end, ends its ranks too
        procs.append(
            subprocess.Popen(
                kept,
                cwd=REPO,
                env=env | {"CPN_WORKER_CONFIG": str(path)},  # the group's credentials, as the agent sets it
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                pass_fds=fds,
            )
        )
    deadline = time.monotonic() + timeout_s
    outputs = []
    for p in procs:
        try:
            outputs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                if q.poll() is None:
                    q.terminate()  # the keeper: SIGKILL to its whole tree
            tails = [q.communicate()[0][-800:] for q in procs]
            return f"timed out after {timeout_s:.0f} s; output tails: {tails}"
    for p, out, reports in zip(procs, outputs, reporting, strict=True):
        results = [json.loads(ln.split(" ", 1)[1]) for ln in out.splitlines() if ln.startswith("CPN_RESULT ")]
        if p.returncode != 0:
            return f"exit {p.returncode}: {out[-1500:]}"
        if not reports:
            continue  # a later node of a group spanning nodes: its group's leader reports
        if not results:
            return f"exit {p.returncode}: {out[-1500:]}"
        if results[-1].get("steps") != r.spec.training.steps or not math.isfinite(results[-1]["final_loss"]):
            return f"bad result {results[-1]}"
    return None


# ------------------------------------------------------------------ main


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=520)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    # Above the workers' sync startup timeout (120 s) plus a peer timeout (30 s): a run whose
    # participant waits out a peer still ends, and is reported as slow rather than cut off.
    ap.add_argument("--run-timeout", type=float, default=180.0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()

    stats: Counter[str] = Counter()
    rejections: list[str] = []
    specs: list[JobSpec] = []
    stages: set[tuple[Any, int]] = set()
    runnable: list[Runnable] = []
    for i in range(args.pairs):
        tiny = rng.random() < 0.5
        snap = cpu_fleet(rng) if tiny else gpu_fleet(rng)
        spec = random_spec(rng, tiny, sorted({c.region for c in snap.clusters}))
        specs.append(spec)
        stats["pairs"] += 1
        try:
            options = plan(spec, snap)
        except NoFeasiblePlan:
            stats["pairs without a feasible plan"] += 1
            continue
        for o in options:
            stats["options"] += 1
            stats[f"options at {o.precision}"] += 1
            stats["options with several nodes"] += len(group_by_node(o)) > 1
            stats["options with a replica across nodes"] += spans_nodes(o)
            stats["options with pp > 1"] += o.pp > 1
            stats["options with tp > 1"] += o.tp > 1
            stats["options with zero > 0"] += o.zero > 0
            stats["options of a BYO entrypoint"] += spec.entrypoint is not None
            if o.pp > 1:
                stages.add((spec.model, o.pp))
            reason = check_option(f"job{i}", spec, o, snap)
            if reason is not None:
                rejections.append(f"pair {i} option {o.id} ({o.dp}x{o.tp}x{o.pp}, z{o.zero}): {reason}")
            elif tiny and o.n_devices <= 4:
                runnable.append(Runnable(spec, o, snap))
    t_check = time.perf_counter() - t0

    mismatches, modules = n_params_mismatches(specs, stages)

    sample = pick_runs(runnable, args.runs, rng)
    failures: list[str] = []
    slow: list[str] = []
    t1 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for k, r in enumerate(sample):
            d = Path(tmp) / str(k)
            d.mkdir()
            started = time.perf_counter()
            why = run_option(r, d, args.run_timeout)
            o = r.option
            print(
                f"  run {k:2d}: {len(group_by_node(o))} node(s){' spanning' if spans_nodes(o) else ''}"
                f" dp={o.dp} tp={o.tp} pp={o.pp} zero={o.zero}"
                f" {o.precision}{' AC' if o.activation_checkpointing else ''}"
                f"{' BYO' if r.spec.entrypoint else ''} sync={r.spec.sync.mode}"
                f" -> {'ok' if why is None else 'FAILED'} ({time.perf_counter() - started:.1f} s)",
                flush=True,
            )
            if why is not None:
                failures.append(f"run {k}: {why}")
            elif time.perf_counter() - started > SLOW_RUN_S:
                slow.append(f"run {k}: {time.perf_counter() - started:.0f} s")
    t_runs = time.perf_counter() - t1

    print()
    print(f"{'what':<40} {'count':>8}")
    for key in sorted(stats):
        print(f"{key:<40} {stats[key]:>8}")
    print(f"{'options rejected by the executor':<40} {len(rejections):>8}")
    print(f"{'GPT modules counted (models, stages)':<40} {modules:>8}")
    print(f"{'parameter-count mismatches':<40} {mismatches:>8}")
    print(f"{'options runnable on local CPUs':<40} {len(runnable):>8}")
    print(f"{'sampled runs (torchrun, 2 steps)':<40} {len(sample):>8}")
    print(f"{'sampled runs failed':<40} {len(failures):>8}")
    print(f"{'sampled runs slower than ' + str(SLOW_RUN_S) + ' s':<40} {len(slow):>8}")
    print(f"plan + check {t_check:.1f} s, runs {t_runs:.1f} s, total {time.perf_counter() - t0:.1f} s")
    for line in rejections[:10] + failures[:5] + slow:
        print(line)
    print(
        json.dumps(
            {
                "options_checked": stats["options"],
                "options_rejected_by_executor": len(rejections),
                "sampled_runs": len(sample),
                "sampled_runs_failed": len(failures),
                "n_params_mismatches": mismatches,
            }
        )
    )


if __name__ == "__main__":
    main()
