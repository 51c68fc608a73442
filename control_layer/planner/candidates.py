"""Parallel degrees worth trying: (dp, tp, pp, zero), respecting pins and the model's shape."""

from __future__ import annotations

from dataclasses import dataclass

from contracts.feasibility import batch_problems, shape_problems
from contracts.job_spec import JobSpec

# Deepest pipeline considered; deeper ones only add bubble for the models this plans.
MAX_PP = 64


@dataclass(frozen=True, order=True)
class Degrees:
    dp: int
    tp: int
    pp: int
    zero: int

    @property
    def devices_per_replica(self) -> int:
        return self.tp * self.pp

    @property
    def n_devices(self) -> int:
        return self.dp * self.tp * self.pp


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def enumerate_degrees(
    spec: JobSpec, max_devices: int, max_node_devices: int
) -> tuple[list[Degrees], list[str], Degrees | None]:
    """All executable degrees that could fit the fleet's size, and why others were left out.

    The runtime's rules (``contracts.feasibility``): dp splits the global batch into whole
    micro-batches, enough of them to fill the pipeline; tp divides the heads; a replica fits on
    one node; a bring-your-own model gets tp = pp = 1. The planner also wants pp to divide the
    layers, so stages are balanced.
    """
    pins = spec.pinned
    model, training = spec.model, spec.training
    batch = spec.global_batch_sequences
    byo = spec.entrypoint is not None
    notes: list[str] = []

    dps = [d for d in divisors(batch) if (batch // d) % training.micro_batch_size == 0]
    if pins.dp is not None:
        if pins.dp not in dps:
            notes.append(
                f"parallelism.dp={pins.dp} does not split the global batch of {batch} sequences into "
                f"micro-batches of {training.micro_batch_size}"
            )
        dps = [d for d in dps if d == pins.dp]
    tps = [1] if byo else divisors(model.n_heads)
    if pins.tp is not None:
        if model.n_heads % pins.tp:
            notes.append(f"parallelism.tp={pins.tp} does not divide model.n_heads={model.n_heads}")
        tps = [t for t in tps if t == pins.tp]
    pps = [1] if byo else [p for p in divisors(model.n_layers) if p <= MAX_PP]
    if pins.pp is not None:
        if model.n_layers % pins.pp:
            notes.append(f"parallelism.pp={pins.pp} does not divide model.n_layers={model.n_layers}")
        pps = [p for p in pps if p == pins.pp]
    shapes = [(t, p) for t in tps for p in pps if t * p <= max(1, max_node_devices)]
    if tps and pps and not shapes:
        smallest_group = min(t * p for t in tps for p in pps)
        notes.append(
            f"a replica needs at least {smallest_group} devices on one node (tp x pp); the largest node"
            f" has {max_node_devices} free (a replica's tensor/pipeline group cannot span nodes)"
        )
    shapes = [
        (t, p)
        for t, p in shapes
        if not shape_problems(
            n_heads=model.n_heads, n_layers=model.n_layers, d_model=model.d_model, tp=t, pp=p
        )
    ]
    zeros = [pins.zero] if pins.zero is not None else [0, 1, 2, 3]
    if byo and "zero" not in spec.byo_parallelism:
        zeros = [z for z in zeros if z == 0]

    out = []
    smallest: Degrees | None = None
    short_pipeline: set[tuple[int, int]] = set()
    for dp in dps:
        for tp, pp in shapes:
            if batch_problems(global_batch=batch, dp=dp, micro_batch=training.micro_batch_size, pp=pp):
                short_pipeline.add((dp, pp))
                continue
            if dp * tp * pp > max_devices:
                if smallest is None or dp * tp * pp < smallest.n_devices:
                    smallest = Degrees(dp, tp, pp, zeros[0] if zeros else 0)
                continue
            # ZeRO shards over replicas; with one replica every stage is the same plan.
            for zero in zeros if dp > 1 or pins.zero is not None else [0]:
                out.append(Degrees(dp, tp, pp, zero))
    if short_pipeline and not out:
        dp, pp = min(short_pipeline)
        notes.append(
            batch_problems(global_batch=batch, dp=dp, micro_batch=training.micro_batch_size, pp=pp)[0]
        )
    return out, notes, (smallest if not out else None)
