"""Does the planner's estimate rank placements as the runtime runs them? And the simulator's?

    python benchmarks/estimator_rank.py [--steps 10] [--reps 2] [--only N]   # root (ip netns)

Network: 4 nodes in network namespaces, every pair joined by its own veth shaped by tc tbf on both
ends (``benchmarks/meshlab.py``, subnet 10.213.41.0/24, ports 30100-30199): 6, 10, 16, 25, 40 and
64 Mbit/s, one rate per pair (``_rank_grid.RATES_MBIT``). No latency is emulated (netem absent).

What the control plane would know, measured here as its agents measure it: every directed link
by the agent's own probe (``agent.probe``: echoes, then 4 MiB streamed, timed at the receiver;
``_mesh_probe.py``), and the node's profile by the agent's reference step
(``agent.profile.measure_profile``, the real worker under torchrun) with the CPU slot's measured
matmul rate (``agent.devices``). The snapshot holds those figures, not the shaped rates.

Job and grid (``_rank_grid.py``): dp 2 x pp 2 of a 3-layer GPT, ``sync``, 8 micro-batches of 4 x
64 tokens per replica; the 12 placements of 4 nodes on (replica, stage). For each, the option a
quote would offer for exactly those tasks (``spanning.option_on``: ``estimate_planned`` with the
runtime settings the control plane gives them) is priced by the estimate and by the independent
simulator (``benchmarks/sim``, given the same snapshot, the measured CPU rate at efficiency 1 and
the planner's transport constants). Then it runs: the control plane's worker configs for those
tasks (``control_layer.worker_config.build_worker_configs``, the job's credentials as allocation
adds them), launched per node in its namespace as the agent launches them (``agent.workers``:
the config as the agent rewrites it, ``worker_command`` -- the authenticated multi-node
rendezvous -- and ``worker_env`` with its gloo interface); a group per replica, stages across
two nodes, the per-stage gradient rings over gRPC between the replicas' nodes. The leaders write
every step's metrics (``metrics_interval_s`` 0, the one change to the config: it only reports
more often). A run is stopped once both leaders have reported the step before the last (what
follows is the final exchange, checkpoint and teardown, tens of seconds here); its step time is
the median over its steps, the first two left out (rendezvous, the first exchange), of the slower
replica's step. The spec sets ``checkpoint_every`` beyond the run: the interval the planner picks
for this job (every 4 steps) sends each checkpoint's copies across the group's own link
(``training.checkpoint_mirror``), over the pipeline's slow link, and steps ran up to twice as long
while they flowed (not priced). Each placement runs ``--reps`` times, the placements shuffled
anew each round (a busy spell on the host lands on different ones), and its measured figure is
the median of its runs.

Figures: Spearman's rank correlation of the estimate's step and of the simulator's step with the
measured one over the placements; the load average is recorded before and after. Prints a table,
then one JSON line: ``{"placements", "spearman_estimator", "spearman_simulator", ...}``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from agent.devices import measure_cpu_tflops  # noqa: E402
from agent.nccl_env import nccl_env  # noqa: E402
from agent.profile import measure_profile  # noqa: E402
from agent.settings import AgentSettings  # noqa: E402
from agent.workers import Assignment, resolve_checkpoint_dir, worker_command, worker_env  # noqa: E402
from benchmarks._host import host_loop_s, patience  # noqa: E402
from benchmarks._rank_grid import (  # noqa: E402
    DP,
    NODES,
    RATES_MBIT,
    SIM_INPUTS,
    GridPlacement,
    estimated_step_s,
    grid,
    job_spec,
    option,
    snapshot,
    spearman,
    steady_figures,
)
from benchmarks.meshlab import MeshLab  # noqa: E402
from benchmarks.netlab import netns_available  # noqa: E402
from benchmarks.sim import simulate  # noqa: E402
from contracts.job_spec import JobSpec  # noqa: E402
from contracts.link_probe import new_probe_key  # noqa: E402
from control_layer.allocation import add_job_credentials  # noqa: E402
from control_layer.planner.plan_types import PlanOption  # noqa: E402
from control_layer.worker_config import TaskSlot, build_worker_configs, validate_worker_config  # noqa: E402

SUBNET, PREFIX = "10.213.41", "cpner"
PORT_BASE, PROBE_PORT = 30100, 30190  # workers' ports 30100-30179 (rotating per run), probes 30190+
PROBE_BYTES = 4 * 1024 * 1024  # the control plane's default probe
SKIP_STEPS = 2  # rendezvous and the first exchange: start-up, not the steady step


def probe_links(lab: MeshLab, root: Path) -> dict[tuple[int, int], tuple[float, float]]:
    """(src, dst) -> (Mbit/s, rtt ms) for every directed pair, by the agent's probe."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    keys = {i: new_probe_key() for i in range(lab.nodes)}
    servers = []
    try:
        for i in range(lab.nodes):
            argv = [sys.executable, "-m", "benchmarks._mesh_probe", "serve", lab.ip(i), str(PROBE_PORT + i)]
            servers.append(lab.popen(i, [*argv, f"node{i}", keys[i]], root / f"probe-{i}.log", env, REPO))
        _wait_for(lambda: all("serving" in (root / f"probe-{i}.log").read_text() for i in range(lab.nodes)))
        out = {}
        for a in range(lab.nodes):
            for b in range(lab.nodes):
                if a == b:
                    continue
                argv = [
                    sys.executable, "-m", "benchmarks._mesh_probe", "probe", lab.ip(b), str(PROBE_PORT + b),
                    f"node{b}", keys[b], str(PROBE_BYTES),
                ]  # fmt: skip
                r = subprocess.run(lab.command(a, argv), env=env, cwd=REPO, capture_output=True, text=True)
                res = (
                    json.loads(r.stdout.strip().splitlines()[-1])
                    if r.returncode == 0
                    else {"error": r.stderr}
                )
                if res.get("error"):
                    raise RuntimeError(f"probe n{a} -> n{b} failed: {res['error']}")
                out[(a, b)] = (float(res["mbit"]), float(res["rtt_ms"]))
        return out
    finally:
        for s in servers:
            s.kill()
            s.wait()


def _wait_for(ready: Any, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + patience(timeout_s)
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError("probe servers did not start")
        time.sleep(0.3)


def node_profile(root: Path) -> tuple[dict[str, Any] | None, float]:
    """The node profile and CPU slot rate an agent of this host registers with."""
    profile = measure_profile("cpu", root / "profile")
    return (profile.as_dict() if profile is not None else None), measure_cpu_tflops()


def slots(lab: MeshLab, o: PlanOption, run: int) -> list[TaskSlot]:
    """One slot per node, as allocation makes them: its address, a sync port for the stage ring it
    leads and, at node rank 0 of its group, one for the rendezvous (ports rotate between runs, so a
    run never waits on the last one's sockets)."""
    out = []
    for i in range(lab.nodes):
        entries = tuple(t for t in o.tasks if t.node == f"node{i}")
        port = PORT_BASE + (run % 5) * 16 + i * 4
        out.append(
            TaskSlot(
                node_id=f"node{i}",
                cluster_id=f"c{i}",
                cluster_name=f"c{i}",
                region=f"n{i}",
                host=lab.ip(i),
                sync_port=port,
                entries=entries,
                group_port=port + 1,
                cross_cluster_host=lab.ip(i),
                stage_ports=(port,),
            )  # fmt: skip
        )
    return out


def agent_config(config: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """The config as the agent rewrites it before launching (``agent.workers``): checkpoint TLS is
    the agent's own, the checkpoint dir under its work dir; plus every step's metrics to a file."""
    config = dict(config)
    if isinstance(config.get("checkpoint"), dict):
        config["checkpoint"] = {k: v for k, v in config["checkpoint"].items() if k != "tls"}
    config = resolve_checkpoint_dir(config, run_dir)
    config["preempt_file"] = str(run_dir / "preempt")
    config["metrics_path"] = str(run_dir / "metrics.jsonl")
    config["metrics_interval_s"] = 0.0
    return config


def run_placement(lab: MeshLab, spec: JobSpec, o: PlanOption, root: Path, run: int) -> dict[str, Any]:
    job_id = f"rank-{run}"
    secret = secrets.token_hex(32)
    placed = slots(lab, o, run)
    configs = build_worker_configs(job_id, spec, o, placed, sync_secret=secret)
    add_job_credentials(configs, job_id, secret)
    procs, dirs = [], []
    settings = AgentSettings.model_fields
    t0 = time.monotonic()
    for i, slot in enumerate(placed):
        run_dir = root / f"run-{run}" / f"node{i}"
        run_dir.mkdir(parents=True)
        config = agent_config(validate_worker_config(configs[slot.node_id]), run_dir)
        path = run_dir / "worker_config.json"
        path.write_text(json.dumps(config))
        a = Assignment(f"{job_id}-{i}", job_id, 1, (0,), 1, config)
        nccl = nccl_env(
            run_dir, socket_ifname=lab.node_dev(i), ib_hca="", debug="",
            timeout_s=float(settings["nccl_timeout_s"].default),
        )  # fmt: skip
        env = worker_env(
            {**os.environ, "PYTHONPATH": str(REPO)}, a, device_kind="cpu", config_path=path, nccl=nccl
        )
        cmd = worker_command(a, path, allow_override=False)
        procs.append(lab.popen_kept(i, cmd, run_dir / "worker.log", env, run_dir))
        dirs.append(run_dir)
    upto = spec.training.steps - 1  # the last step holds the final exchange and checkpoint
    try:
        leaders = _until_step(procs, dirs, upto, run)
    finally:
        for p in procs:  # the keeper ends its tree (SIGTERM, then SIGKILL after its grace)
            p.terminate()
        for p in procs:
            p.wait()
    return steady_figures(leaders, SKIP_STEPS, upto) | {"wall_s": time.monotonic() - t0}


def _until_step(
    procs: list[subprocess.Popen[bytes]], dirs: list[Path], upto: int, run: int
) -> list[list[dict]]:
    """Wait until every group's leader has reported step ``upto`` (the steps measured: what
    follows is the final exchange, checkpoint and teardown, which the run is stopped before);
    the leaders' per-step metrics. A worker tree that exits first failed the run."""
    deadline = time.monotonic() + patience(900.0)
    while time.monotonic() < deadline:
        leaders = [
            [
                json.loads(line)
                for line in (d / "metrics.jsonl").read_text().splitlines()
                if line.endswith("}")
            ]
            for d in dirs
            if (d / "metrics.jsonl").exists()  # a group's leader writes them
        ]
        done = [max((m.get("step", 0) for m in lines), default=0) >= upto for lines in leaders]
        if len(done) == DP and all(done):
            return leaders
        codes = [p.poll() for p in procs]
        if any(c is not None for c in codes):
            logs = {
                d.name: _first_error((d / "worker.log").read_text()) for d, c in zip(dirs, codes, strict=True)
            }
            raise RuntimeError(f"run {run}: workers exited {codes} before step {upto}: {logs}")
        time.sleep(0.5)
    raise TimeoutError(f"run {run}: step {upto} not reached")


def _first_error(log: str) -> str:
    """The first traceback or CPN_ERROR line of a worker's log, shortened."""
    at = min((i for i in (log.find("Traceback"), log.find("CPN_ERROR")) if i >= 0), default=0)
    return log[at : at + 1500]


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def measure(
    lab: MeshLab, spec: JobSpec, options: dict[GridPlacement, PlanOption], root: Path, reps: int, seed: int
) -> dict[GridPlacement, list[dict[str, float]]]:
    """Every placement ``reps`` times, in a new shuffled order each round."""
    runs: dict[GridPlacement, list[dict[str, float]]] = {p: [] for p in options}
    rng, run = random.Random(seed), 0
    for rep in range(reps):
        order = list(options)
        rng.shuffle(order)
        for p in order:
            r = run_placement(lab, spec, options[p], root, run)
            run += 1
            runs[p].append(r)
            print(
                f"round {rep + 1} {p.name}: {r['step_s']:.3f} s/step over {r['steps']:.0f} steps, compute "
                f"{r['compute_s']:.3f} s, blocked in the exchange {r['sync_blocked_s']:.3f} s "
                f"(run {r['wall_s']:.0f} s, load {load()})",
                flush=True,
            )
    return runs


def table(
    options: dict[GridPlacement, PlanOption],
    runs: dict[GridPlacement, list[dict[str, float]]],
    measured: dict[GridPlacement, float],
    sim: dict[GridPlacement, float],
) -> None:
    """One row per placement, fastest measured first: its links, the measured step (each run's
    too) with its compute and exchange, and the estimate (with its parts) and simulator beside."""
    print()
    print("| placement (replica: stage 0-stage 1) | pipeline links Mbit/s | ring links (stage 0, 1) "
          "| measured s/step (runs) | measured compute / exchange s | estimate s/step "
          "| estimate compute / pp comm / exchange s | simulator s/step | estimate / measured |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for p in sorted(options, key=lambda q: measured[q]):
        each = ", ".join(f"{r['step_s']:.3f}" for r in runs[p])
        comp = statistics.median(r["compute_s"] for r in runs[p])
        blocked = statistics.median(r["sync_blocked_s"] for r in runs[p])
        st = options[p].estimates.step_s
        e = estimated_step_s(options[p])
        pl = ", ".join(f"{RATES_MBIT[k]:g}" for k in p.pipeline_links())
        rl = ", ".join(f"{RATES_MBIT[k]:g}" for k in p.ring_links())
        print(f"| {p.name} | {pl} | {rl} | {measured[p]:.3f} ({each}) | {comp:.3f} / {blocked:.3f} | {e:.3f} "
              f"| {st.compute:.3f} / {st.pp_comm:.3f} / {st.wan_sync:.3f} | {sim[p]:.3f} "
              f"| {e / measured[p]:.2f} |")  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--only", type=int, default=0, help="the first N placements only (a check of the script)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", type=Path, help="keep the runs' configs and logs under this new directory")
    args = ap.parse_args()
    if not 1 <= args.reps <= 20 or not SKIP_STEPS + 2 <= args.steps <= 200:
        print(f"--reps must be 1 to 20 and --steps {SKIP_STEPS + 2} to 200", file=sys.stderr)
        return 2
    why = netns_available()
    if why:
        print(f"needs network namespaces: {why}", file=sys.stderr)
        return 2
    spec = job_spec(args.steps)
    placements = grid()[: args.only or None]
    t_all, load_before, loop_s = time.monotonic(), load(), host_loop_s()
    with tempfile.TemporaryDirectory() as tmp, MeshLab(NODES, RATES_MBIT, PREFIX, SUBNET) as lab:
        root = Path(tmp)
        if args.keep:
            args.keep.mkdir(parents=True)
            root = args.keep
        print(lab.describe() + "; no latency emulation (netem absent)", flush=True)
        probed = probe_links(lab, root)
        print(
            "probed (Mbit/s): "
            + ", ".join(f"n{a}->n{b} {m:.2f}" for (a, b), (m, _) in sorted(probed.items()))
        )
        profile, tflops = node_profile(root)
        print(f"node profile: {json.dumps(profile)}; CPU slot {tflops:.4f} TFLOPS", flush=True)
        snap = snapshot(
            {k: m for k, (m, _) in probed.items()},
            profile,
            tflops,
            rtt_ms={k: r for k, (_, r) in probed.items()},
        )
        options = {p: option(spec, snap, p) for p in placements}
        sim = {p: simulate(spec, o, snap, efficiency=1.0, **SIM_INPUTS).step_s for p, o in options.items()}
        runs = measure(lab, spec, options, root, args.reps, args.seed)
    measured = {p: statistics.median(r["step_s"] for r in v) for p, v in runs.items()}
    est = {p: estimated_step_s(o) for p, o in options.items()}
    table(options, runs, measured, sim)
    xs = [measured[p] for p in placements]
    summary = {
        "placements": len(placements),
        "spearman_estimator": round(spearman([est[p] for p in placements], xs), 4),
        "spearman_simulator": round(spearman([sim[p] for p in placements], xs), 4),
        "runs_per_placement": args.reps,
        "steps": args.steps,
        "host_loop_s": round(loop_s, 3),
        "load_before": load_before,
        "load_after": load(),
        "wall_s": round(time.monotonic() - t_all, 1),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
