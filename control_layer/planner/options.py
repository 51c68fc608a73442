"""Turn a solved placement into a complete PlanOption: tasks, estimates, QoS checks, stable id."""

from __future__ import annotations

import hashlib
import json

from contracts.job_spec import JobSpec
from contracts.registration import runs_user_code
from control_layer.planner import cost_model as cm
from control_layer.planner.assign import assign
from control_layer.planner.calibrated import quality_fields
from control_layer.planner.estimate import estimate_planned
from control_layer.planner.placement import Placement
from control_layer.planner.plan_types import Estimates, PlannedTask, PlanOption, QosCheck
from control_layer.planner.problem import Problem, Solution
from control_layer.planner.replicas import device_slots
from control_layer.planner.snapshot import ResourceSnapshot
from control_layer.planner.sync_choice import AutoSync

# Relative slack when comparing an estimate with a QoS bound (float noise only).
QOS_TOLERANCE = 1e-9


def option_id(payload: dict) -> str:
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def plan_id(spec: JobSpec, dp: int, tp: int, pp: int, zero: int, spot: bool, tasks: list[PlannedTask]) -> str:
    """An option's id: its degrees, precision, spot and where each task sits. Tasks come in
    (dp rank, stage, tp rank) order, so their places identify the plan."""
    return option_id(
        {
            "degrees": [dp, tp, pp, zero, spec.pp_schedule],
            "precision": [spec.training.precision, spec.training.activation_checkpointing],
            "spot": spot,
            "tasks": "\n".join(f"{t.cluster}/{t.node}/{t.device}" for t in tasks),
        }
    )


def qos_checks(
    spec: JobSpec, snapshot: ResourceSnapshot, tasks: list[PlannedTask], est: Estimates, spot: bool
) -> list[QosCheck]:
    """Check every constraint against the tasks themselves (not against the filters that chose them)."""
    qos = spec.qos
    clusters = snapshot.clusters_by_id()
    regions = sorted({clusters[t.cluster].region for t in tasks})
    index = device_slots(snapshot)
    slots = {(t.cluster, t.node, t.device): index[(t.cluster, t.node)][t.device] for t in tasks}.values()
    models = sorted({s.model for s in slots})
    checks: list[QosCheck] = []

    def add(name: str, ok: bool, detail: str) -> None:
        checks.append(QosCheck(name=name, ok=ok, detail=detail))

    smallest = min(s.memory_gb for s in slots)
    usable = cm.USABLE_MEMORY_FRACTION * smallest
    add(
        "memory",
        est.memory_per_device_gb <= usable * (1 + QOS_TOLERANCE),
        f"peak {est.memory_per_device_gb:.2f} GB per device ≤ {usable:.2f} GB usable",
    )
    hours = est.duration_s / 3600.0
    if qos.max_hours is not None:
        add("max_hours", hours <= qos.max_hours * (1 + QOS_TOLERANCE), f"{hours:.2f} h ≤ {qos.max_hours:g} h")
    if qos.max_cost is not None:
        add(
            "max_cost",
            est.cost.total <= qos.max_cost * (1 + QOS_TOLERANCE),
            f"${est.cost.total:,.2f} ≤ ${qos.max_cost:,.2f}",
        )
    if qos.regions is not None:
        add("regions", set(regions) <= set(qos.regions), f"{regions} within {sorted(qos.regions)}")
    if qos.exclude_regions:
        add(
            "exclude_regions",
            not set(regions) & set(qos.exclude_regions),
            f"none of {sorted(qos.exclude_regions)} used",
        )
    if qos.data_residency:
        bad = [r for r in regions if snapshot.jurisdiction(r).upper() != qos.data_residency.upper()]
        add(
            "data_residency",
            not bad,
            f"all regions in {qos.data_residency}" if not bad else f"outside: {bad}",
        )
    if spec.data.region:
        add("data_region", regions == [spec.data.region], f"all readers in {spec.data.region}")
    if qos.accelerators:
        kinds = [a.lower() for a in qos.accelerators]
        bad = [m for m in models if not any(k in m.lower() for k in kinds)]
        add("accelerators", not bad, f"{models} allowed by {qos.accelerators}")
    if qos.min_gpu_mem_gb is not None:
        add(
            "min_gpu_mem_gb",
            smallest >= qos.min_gpu_mem_gb,
            f"smallest device {smallest:g} GB ≥ {qos.min_gpu_mem_gb:g} GB",
        )
    if spec.entrypoint is not None:
        nodes = {(c, n.id): n for c in {t.cluster for t in tasks} for n in clusters[c].nodes}
        closed = sorted({t.node for t in tasks if not runs_user_code(nodes[(t.cluster, t.node)].sandbox)})
        add(
            "sandbox",
            not closed,
            "users' code on nodes that confine it (or whose provider allowed it unconfined)"
            if not closed
            else f"nodes that run no users' code: {closed}",
        )
    add(
        "preemptible",
        qos.preemptible or not spot,
        "spot capacity used" if spot else "on-demand capacity only",
    )
    return checks


def build_option(pr: Problem, sol: Solution, auto: AutoSync | None = None) -> PlanOption:
    """The option of a solved placement, priced with its runtime settings; ``auto``: the sync
    settings the spec left to the planner (``pr``'s spec holds them provisionally resolved)."""
    fleet = pr.fleet
    spec, snapshot = fleet.spec, fleet.snapshot
    deg = pr.deg
    a = assign(pr, sol)
    clusters = snapshot.clusters_by_id()
    spot = spec.qos.preemptible and any(
        clusters[t.cluster].spot_price_per_device_hour is not None
        and clusters[t.cluster].spot_price_per_device_hour < clusters[t.cluster].price_per_device_hour
        for t in a.tasks
    )
    # Priced once, with the runtime settings its workers get (the search ranked it the same way).
    placement = Placement(
        spec,
        snapshot,
        a.tasks,
        dp=deg.dp,
        tp=deg.tp,
        pp=deg.pp,
        zero=deg.zero,
        pp_schedule=spec.pp_schedule,
        spot=spot,
        calibration=fleet.calibration,
    )
    est, runtime = estimate_planned(placement, replicas=a.replicas, auto=auto or AutoSync())
    # The exchange the estimate priced (flat ring or hierarchical) is the one the workers run.
    topology = a.sync.model_copy(update={"hierarchical": est.basis.exchange.hierarchical})
    if runtime.sync_every is not None:
        topology = topology.model_copy(update={"every": runtime.sync_every})
    fields = quality_fields(
        topology.mode, topology.every, topology.compression, runtime.overlap, spec.sync.calibration
    )
    sync = topology.model_copy(update=fields)
    return PlanOption(
        id=plan_id(spec, deg.dp, deg.tp, deg.pp, deg.zero, spot, a.tasks),
        dp=deg.dp,
        tp=deg.tp,
        pp=deg.pp,
        zero=deg.zero,
        pp_schedule=spec.pp_schedule,
        micro_batch_size=spec.training.micro_batch_size,
        n_micro_batches=pr.n_micro,
        spot=spot,
        precision=spec.training.precision,
        activation_checkpointing=spec.training.activation_checkpointing,
        replicas_per_cluster=a.replicas_per_cluster,
        tasks=a.tasks,
        sync=sync,
        runtime=runtime,
        estimates=est,
        qos_checks=qos_checks(spec, snapshot, a.tasks, est, spot),
        regions=a.regions,
    )
