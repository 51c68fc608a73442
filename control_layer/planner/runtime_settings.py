"""An option's runtime settings (checkpoint interval, overlap, fragments) from its local step, its
participants and the links between its regions. Pure.

The estimator derives them while it prices an option (``estimate.estimate_planned``), so a quote
is priced once, with the settings its workers get; ``runtime_pricing`` holds the rules both
use and the search's objective applies them to every placement it ranks.
"""

from __future__ import annotations

from contracts.job_spec import JobSpec
from control_layer.planner.checkpoint_policy import checkpoint_fraction
from control_layer.planner.plan_types import PlanOption, RuntimeSettings
from control_layer.planner.runtime_pricing import checkpoint_every, runtime_terms
from control_layer.planner.snapshot import ResourceSnapshot
from control_layer.planner.sync_choice import pinned, sync_overlaps
from control_layer.planner.sync_settings import payload_bytes, sync_settings


def weakest_link(regions: set[str], snapshot: ResourceSnapshot | None) -> tuple[float | None, float]:
    """(bits/s, one-way latency s) of the slowest link between these regions, as declared or
    measured; (None, 0) with fewer than two regions or a pair with no link."""
    names = sorted(regions)
    if snapshot is None or len(names) < 2:
        return None, 0.0
    links = [snapshot.link(a, b) for a in names for b in names if a != b]
    if any(ln is None for ln in links):
        return None, 0.0
    return (
        min(ln.bandwidth_gbps for ln in links if ln) * 1e9,
        max(ln.latency_ms for ln in links if ln) / 1e3,
    )


def settings_for(
    spec: JobSpec,
    step_s: float,
    participants: int,
    bandwidth_bps: float | None,
    latency_s: float,
    exchange_seconds: float | None = None,
) -> RuntimeSettings:
    """Checkpoint interval (the spec's, else the smallest whose writes take at most 2 % of the run)
    and the sync mode's overlap/fragments for a placement whose local step (without the exchange
    and checkpoint writes) is ``step_s`` and whose ``participants`` nodes sync over links no faster
    than ``bandwidth_bps``; ``exchange_seconds``, where the caller priced the exchange (the
    estimator, with the calibrated goodput and per-call seconds), sets the overlap delay."""
    terms = runtime_terms(spec)
    steps = spec.training.steps
    every = int(checkpoint_every(terms, step_s))
    sync = sync_settings(
        mode=spec.sync.mode,
        every=spec.sync.every,
        n_regions=participants,
        payload=payload_bytes(spec.model.n_params, spec.sync.compression, spec.sync.topk_ratio),
        step_s=step_s,
        bandwidth_bps=bandwidth_bps,
        latency_s=latency_s,
        exchange_seconds=exchange_seconds,
        overlap_ok=sync_overlaps(spec),
    )
    return RuntimeSettings(
        checkpoint_every=every,
        checkpoint_write_s=terms.write_s,
        checkpoint_fraction=checkpoint_fraction(step_s, terms.write_s, every, steps),
        overlap=sync.overlap,
        overlap_steps=sync.overlap_steps,
        fragments=sync.fragments,
        overlap_merge=sync.merge,
        reason=sync.reason,
    )


def runtime_settings(
    spec: JobSpec, option: PlanOption, snapshot: ResourceSnapshot | None = None
) -> RuntimeSettings:
    """The settings for an option that does not carry them (planned options do): from its local
    step (without the exchange and checkpoint writes) and its nodes and regions."""
    spec = pinned(spec, option)
    s = option.estimates.step_s
    step_s = max(0.0, s.total - s.wan_sync - s.checkpoint)
    regions = set(option.regions) or {t.region for t in option.tasks if t.region}
    bandwidth, latency = weakest_link(regions, snapshot)
    return settings_for(spec, step_s, len({t.node for t in option.tasks}), bandwidth, latency)
