"""Parallel degrees worth trying: (dp, tp, pp, zero), respecting pins and the model's shape."""

from __future__ import annotations

from dataclasses import dataclass

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
) -> tuple[list[Degrees], list[str]]:
    """All shape-valid degrees that could fit the fleet's size, and why others were left out.

    dp divides the global batch into whole micro-batches; tp divides the heads (so d_model too)
    and fits in a node; pp divides the layers so stages are balanced.
    """
    pins = spec.pinned
    model, training = spec.model, spec.training
    batch = spec.global_batch_sequences
    notes: list[str] = []

    dps = [d for d in divisors(batch) if (batch // d) % training.micro_batch_size == 0]
    if pins.dp is not None:
        if pins.dp not in dps:
            notes.append(
                f"parallelism.dp={pins.dp} does not split the global batch of {batch} sequences into "
                f"micro-batches of {training.micro_batch_size}"
            )
        dps = [d for d in dps if d == pins.dp]
    tps = [t for t in divisors(model.n_heads) if t <= max(1, max_node_devices)]
    if pins.tp is not None:
        if model.n_heads % pins.tp:
            notes.append(f"parallelism.tp={pins.tp} does not divide model.n_heads={model.n_heads}")
        elif pins.tp > max_node_devices:
            notes.append(
                f"parallelism.tp={pins.tp} exceeds the largest node ({max_node_devices} free devices)"
            )
        tps = [t for t in tps if t == pins.tp]
    pps = [p for p in divisors(model.n_layers) if p <= MAX_PP]
    if pins.pp is not None:
        if model.n_layers % pins.pp:
            notes.append(f"parallelism.pp={pins.pp} does not divide model.n_layers={model.n_layers}")
        pps = [p for p in pps if p == pins.pp]
    zeros = [pins.zero] if pins.zero is not None else [0, 1, 2, 3]

    out = []
    smallest: Degrees | None = None
    for dp in dps:
        for tp in tps:
            for pp in pps:
                if dp * tp * pp > max_devices:
                    if smallest is None or dp * tp * pp < smallest.n_devices:
                        smallest = Degrees(dp, tp, pp, zeros[0])
                    continue
                # ZeRO shards over replicas; with one replica every stage is the same plan.
                for zero in zeros if dp > 1 or pins.zero is not None else [0]:
                    out.append(Degrees(dp, tp, pp, zero))
    return out, notes, (smallest if not out else None)
