"""An option's runtime settings (checkpoint interval, overlap, fragments) from the option's own
estimates and the links between its regions. Pure."""

from __future__ import annotations

from contracts.job_spec import JobSpec
from control_layer.planner.checkpoint_policy import (
    checkpoint_every,
    checkpoint_fraction,
    checkpoint_write_s,
)
from control_layer.planner.estimate import estimate_option
from control_layer.planner.options import qos_checks
from control_layer.planner.plan_types import Calibration, PlanOption, RuntimeSettings
from control_layer.planner.quality import quality
from control_layer.planner.search import finish
from control_layer.planner.snapshot import ResourceSnapshot
from control_layer.planner.sync_settings import payload_bytes, sync_settings


def _compute_step_s(option: PlanOption) -> float:
    """Seconds per step excluding the WAN exchange and checkpoint writes: what overlap hides the
    exchange behind, and what the checkpoint share is measured against (neither depends on the
    runtime settings chosen from it, so re-pricing with them leaves it unchanged)."""
    s = option.estimates.step_s
    return max(0.0, s.total - s.wan_sync - s.checkpoint)


def _weakest_link(option: PlanOption, snapshot: ResourceSnapshot | None) -> tuple[float | None, float]:
    """(bits/s, one-way latency s) of the slowest link between the option's regions."""
    regions = sorted(set(option.regions) or {t.region for t in option.tasks if t.region})
    if snapshot is None or len(regions) < 2:
        return None, 0.0
    links = [snapshot.link(a, b) for a in regions for b in regions if a != b]
    if any(ln is None for ln in links):
        return None, 0.0
    return (
        min(ln.bandwidth_gbps for ln in links if ln) * 1e9,
        max(ln.latency_ms for ln in links if ln) / 1e3,
    )


def runtime_settings(
    spec: JobSpec, option: PlanOption, snapshot: ResourceSnapshot | None = None
) -> RuntimeSettings:
    """Checkpoint interval (the spec's, else the largest share of 2 % of the run) and the sync
    mode's overlap/fragments for this option."""
    step_s = _compute_step_s(option)
    nodes = {t.node for t in option.tasks}
    per_node = max(1, option.dp // max(1, len(nodes)))
    write_s = checkpoint_write_s(spec.model.n_params, per_node)
    steps = spec.training.steps
    every = spec.training.checkpoint_every or checkpoint_every(step_s, write_s, steps)
    every = min(every, steps)
    bandwidth, latency = _weakest_link(option, snapshot)
    sync = sync_settings(
        mode=spec.sync.mode,
        every=spec.sync.every,
        n_regions=len(nodes),
        payload=payload_bytes(spec.model.n_params, spec.sync.compression, spec.sync.topk_ratio),
        step_s=step_s,
        bandwidth_bps=bandwidth,
        latency_s=latency,
    )
    return RuntimeSettings(
        checkpoint_every=every,
        checkpoint_write_s=write_s,
        checkpoint_fraction=checkpoint_fraction(step_s, write_s, every, steps),
        overlap=sync.overlap,
        overlap_steps=sync.overlap_steps,
        fragments=sync.fragments,
        reason=sync.reason,
    )


def with_runtime(
    spec: JobSpec,
    options: list[PlanOption],
    snapshot: ResourceSnapshot,
    calibration: Calibration | None = None,
    max_options: int = 5,
) -> list[PlanOption]:
    """Each option with its runtime settings, re-priced as its workers will run: the quote covers
    the checkpoints they write and the exchange time that overlap hides (or does not). Re-pricing
    can move a point, so the front is filtered and labelled again."""
    out: list[PlanOption] = []
    for o in options:
        runtime = runtime_settings(spec, o, snapshot)
        est = estimate_option(
            spec,
            snapshot,
            o.tasks,
            dp=o.dp,
            tp=o.tp,
            pp=o.pp,
            zero=o.zero,
            pp_schedule=o.pp_schedule,
            spot=o.spot,
            calibration=calibration,
            runtime=runtime,
        )
        checks = qos_checks(spec, snapshot, o.tasks, est, o.spot)
        q = quality(o.sync.mode, o.sync.every, o.sync.compression, overlap=runtime.overlap)
        sync = o.sync.model_copy(
            update={
                "loss_ratio": None if q is None else q.loss_ratio,
                "loss_ratio_basis": "" if q is None else q.measured_as,
            }
        )
        out.append(
            o.model_copy(update={"runtime": runtime, "estimates": est, "qos_checks": checks, "sync": sync})
        )
    # Checkpoints can tip an option over a deadline or budget it met when priced without them.
    kept = [o for o in out if all(c.ok for c in o.qos_checks)]
    return finish(kept or out, spec.qos.objective, max_options)
