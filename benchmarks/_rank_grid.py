"""The placements ``estimator_rank.py`` ranks, and what the control plane knows of their nodes.

Pure: the job, the grid of placements, the snapshot built from measured links and a measured
node profile, the planner's pricing of each placement (``spanning`` builds the option a quote
would offer for exactly these tasks), the simulator's, and Spearman's rank correlation.

Four nodes, each its own region (a cluster of one CPU slot whose agent declared it may share a
torchrun group with other clusters), every pair joined by its own link. The job: dp 2 x pp 2 of
a 3-layer GPT (two blocks and the embeddings on one stage, one block and the untied head on the
other), ``sync`` mode. A placement says which two nodes form each replica's pipeline and which of
them holds stage 0: each replica's two stages meet over one link (activations forward, gradients
back, every micro-batch), and each stage's two copies ring their gradients over another (the
per-stage rings of ``training.sync.stages``) every step. 4! = 24 assignments of nodes to (replica,
stage); swapping the replicas changes nothing, so 12 placements, each putting a different pair of
links under the pipelines and the rings, and the heavier stage's ring on one or the other.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from contracts.job_spec import JobSpec
from control_layer.planner.candidates import Degrees
from control_layer.planner.plan_types import PlannedTask, PlanOption
from control_layer.planner.snapshot import ResourceSnapshot
from control_layer.planner.spanning import option_on

NODES = 4
DP, PP = 2, 2
# Every pair's tbf rate, Mbit/s: six distinct rates, so each placement's links differ.
RATES_MBIT: dict[tuple[int, int], float] = {
    (0, 1): 6.0,
    (0, 2): 10.0,
    (0, 3): 16.0,
    (1, 2): 25.0,
    (1, 3): 40.0,
    (2, 3): 64.0,
}
MODEL = {"n_layers": 3, "d_model": 128, "n_heads": 4, "vocab": 256, "seq_len": 64}
MICRO_BATCH, MICRO_BATCHES = 4, 8  # sequences per micro-batch; micro-batches per replica and step
DATA = {"kind": "synthetic-markov", "seed": 3}
# The simulator's transport inputs: the planner's own defaults (as ``sim_vs_planner.py``); links
# at the probed rate (goodput 1: a probe measures payload bytes over the shaped link).
SIM_INPUTS = {"lan_goodput": 0.9, "wan_goodput": 1.0, "call_s": 0.003, "param_s": 16e-9, "fixed_s": 0.010}


def region(node: int) -> str:
    return f"n{node}"


@dataclass(frozen=True)
class GridPlacement:
    """``replicas[r][s]``: the node holding stage s of replica r."""

    replicas: tuple[tuple[int, ...], ...]

    @property
    def name(self) -> str:
        return " | ".join("-".join(region(n) for n in rep) for rep in self.replicas)

    def pipeline_links(self) -> list[tuple[int, int]]:
        return [_pair(rep[s], rep[s + 1]) for rep in self.replicas for s in range(len(rep) - 1)]

    def ring_links(self) -> list[tuple[int, int]]:
        stages = len(self.replicas[0])
        return [_pair(*(rep[s] for rep in self.replicas)) for s in range(stages)]


def _pair(a: int, b: int) -> tuple[int, int]:
    return (a, b) if a < b else (b, a)


def grid(nodes: int = NODES, dp: int = DP, pp: int = PP) -> list[GridPlacement]:
    """Every assignment of the nodes to (replica, stage), one per class of replica orders (the
    replicas are alike: listing them in another order is the same placement)."""
    if nodes != dp * pp:
        raise ValueError(f"the grid places one stage per node: nodes ({nodes}) must be dp x pp ({dp * pp})")
    out, seen = [], set()
    for perm in itertools.permutations(range(nodes)):
        reps = tuple(tuple(perm[r * pp : (r + 1) * pp]) for r in range(dp))
        key = tuple(sorted(reps))
        if key in seen:
            continue
        seen.add(key)
        out.append(GridPlacement(key))
    return out


def job_spec(steps: int) -> JobSpec:
    if not 2 <= steps <= 10_000:
        raise ValueError(f"steps must be 2 to 10,000, got {steps}")
    sequences = DP * MICRO_BATCHES * MICRO_BATCH
    return JobSpec.model_validate(
        {
            "name": "estimator-rank",
            "model": {"family": "gpt", **MODEL},
            "data": DATA,
            "training": {
                "steps": steps,
                "global_batch_tokens": sequences * MODEL["seq_len"],
                "micro_batch_size": MICRO_BATCH,
                "lr": 1e-3,
                "warmup_steps": 1,
                "seed": 7,
                # Past the run: the planner's interval (every 4 steps here) would send checkpoint
                # copies over the group's links beside the pipeline's traffic (not priced).
                "checkpoint_every": 100_000,
                "precision": "fp32",  # a CPU pool's (the planner resolves "auto" per pool)
            },
            "parallelism": {"dp": DP, "tp": 1, "pp": PP, "zero": 0},
            "sync": {"mode": "sync", "every": 1, "compression": "none"},
            "qos": {"max_hours": 4, "objective": "cost"},
        }
    )


def snapshot(
    links_mbit: Mapping[tuple[int, int], float],
    profile: dict[str, Any] | None,
    device_tflops: float,
    memory_gb: float = 4.0,
    nodes: int = NODES,
    rtt_ms: Mapping[tuple[int, int], float] | None = None,
) -> ResourceSnapshot:
    """What the control plane holds: a region per node (one cluster of one CPU slot, declared
    reachable from other clusters), the node's measured profile, and each link as its probes
    measured it (``links_mbit``: (src, dst) -> Mbit/s, per direction as the link view keeps them;
    latency half the round trip)."""
    clusters = [
        {
            "id": f"c{i}",
            "name": f"c{i}",
            "region": region(i),
            "price_per_device_hour": 1.0,
            "nodes": [
                {
                    "id": f"node{i}",
                    "devices": [
                        {
                            "index": 0,
                            "model": "cpu",
                            "memory_gb": memory_gb,
                            "tflops": device_tflops,
                            "kind": "cpu",
                        }
                    ],
                    "profile": profile,
                    "cross_cluster_groups": True,
                    "sandbox": "unsandboxed-allowed",
                }
            ],
        }
        for i in range(nodes)
    ]
    links = [
        {
            "src": region(a),
            "dst": region(b),
            "bandwidth_gbps": mbit / 1e3,
            "latency_ms": (rtt_ms or {}).get((a, b), 0.2) / 2,
            "source": "measured",
            "private": True,
        }
        for (a, b), mbit in sorted(links_mbit.items())
    ]
    return ResourceSnapshot.model_validate(
        {"regions": [{"name": region(i)} for i in range(nodes)], "clusters": clusters, "links": links}
    )


def tasks(p: GridPlacement) -> list[PlannedTask]:
    return [
        PlannedTask(
            dp_rank=r, pp_stage=s, tp_rank=0, cluster=f"c{n}", node=f"node{n}", device=0, region=region(n)
        )
        for r, rep in enumerate(p.replicas)
        for s, n in enumerate(rep)
    ]


def option(spec: JobSpec, snap: ResourceSnapshot, p: GridPlacement) -> PlanOption:
    """The option a quote offers for exactly these tasks (``tasks``): priced by
    ``estimate_planned`` with the runtime settings the control plane gives them
    (``spanning.option_on``, as spanning prices its own)."""
    deg = Degrees(dp=DP, tp=1, pp=PP, zero=0)
    built = option_on(spec, snap, deg, [[(f"c{n}", f"node{n}", 0) for n in rep] for rep in p.replicas])
    if built is None:
        raise ValueError(f"placement {p.name}: the planner prices no option (memory or QoS)")
    return built


def estimated_step_s(o: PlanOption) -> float:
    """The step the estimate prices, without the amortised checkpoint writes (the benchmark's runs
    write none)."""
    return o.estimates.step_s.total - o.estimates.step_s.checkpoint


def steady_figures(leaders: Sequence[Sequence[Mapping[str, Any]]], skip: int, upto: int) -> dict[str, float]:
    """A run's steady step from its groups' leaders' per-step metrics: per step the slower group's
    wall time (in ``sync`` every group waits for the others each step), the median over the steps
    after the first ``skip`` (start-up: rendezvous, the first exchange) up to ``upto`` (before the
    last, which holds the final exchange and checkpoint, ``training.runtime``). Beside it, the
    medians of the slower group's compute and of its time blocked in the exchange."""
    wall: dict[int, float] = {}
    parts: dict[int, tuple[float, float]] = {}
    for lines in leaders:
        for m in lines:
            step = m.get("step")
            if not isinstance(step, int) or "wall_s" not in m:
                continue
            if float(m["wall_s"]) >= wall.get(step, -1.0):
                wall[step] = float(m["wall_s"])
                sync = m.get("sync") if isinstance(m.get("sync"), dict) else {}
                parts[step] = (float(m.get("compute_s", 0.0)), float(sync.get("blocked_s", 0.0)))
    steady = [s for s in sorted(wall) if skip < s <= upto]
    if not steady:
        raise ValueError(f"no step metrics after step {skip} up to {upto}")
    return {
        "step_s": statistics.median(wall[s] for s in steady),
        "compute_s": statistics.median(parts[s][0] for s in steady),
        "sync_blocked_s": statistics.median(parts[s][1] for s in steady),
        "steps": float(len(steady)),
    }


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation: Pearson's over ranks, ties taking their mean rank."""
    if len(x) != len(y) or len(x) < 2:
        raise ValueError("spearman needs two sequences of one length, at least 2")
    rx, ry = _ranks(x), _ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    vx = math.sqrt(sum((a - mx) ** 2 for a in rx))
    vy = math.sqrt(sum((b - my) ** 2 for b in ry))
    if vx == 0 or vy == 0:
        return float("nan")
    return cov / (vx * vy)


def _ranks(v: Sequence[float]) -> list[float]:
    order = sorted(range(len(v)), key=lambda i: v[i])
    ranks = [0.0] * len(v)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks
