"""The planner: (job spec, resource snapshot) -> priced placement options. Pure: no I/O.

from control_layer.planner import plan
options = plan(spec, snapshot)          # raises NoFeasiblePlan with a structured explanation
"""

from __future__ import annotations

from contracts.errors import InvalidArgument
from contracts.job_spec import (
    DataSpec,
    JobSpec,
    ModelSpec,
    ParallelismSpec,
    QoSSpec,
    SyncSpec,
    TrainingSpec,
)
from control_layer.planner.estimate import estimate_option
from control_layer.planner.fleet import prepare_pools
from control_layer.planner.placement import Placement
from control_layer.planner.plan_types import (
    Calibration,
    CostBreakdown,
    Estimates,
    PlannedTask,
    PlanOption,
    QosCheck,
    StepBreakdown,
    SyncTopology,
)
from control_layer.planner.problem import prepare_classes
from control_layer.planner.search import search as _search
from control_layer.planner.snapshot import (
    ClusterInfo,
    DeviceSlot,
    LinkInfo,
    NodeInfo,
    RegionInfo,
    ResourceSnapshot,
)
from control_layer.planner.staging import DataStaging, NodeStaging, StagedBlob

__all__ = [
    "Calibration",
    "ClusterInfo",
    "CostBreakdown",
    "DataSpec",
    "DataStaging",
    "DeviceSlot",
    "Estimates",
    "JobSpec",
    "LinkInfo",
    "ModelSpec",
    "NodeInfo",
    "NodeStaging",
    "ParallelismSpec",
    "PlanOption",
    "Placement",
    "PlannedTask",
    "QoSSpec",
    "QosCheck",
    "RegionInfo",
    "ResourceSnapshot",
    "StagedBlob",
    "StepBreakdown",
    "SyncSpec",
    "SyncTopology",
    "TrainingSpec",
    "estimate_option",
    "plan",
    "prepare",
]


def plan(
    spec: JobSpec,
    snapshot: ResourceSnapshot,
    calibration: Calibration | None = None,
    max_options: int = 5,
    staging: DataStaging | None = None,
) -> list[PlanOption]:
    """Priced options on the cost-vs-time Pareto front, best for spec.qos.objective first.

    Each option is complete (degrees, per-device tasks, sync topology, estimates with breakdowns,
    the QoS checks it passed), with the calibrated factors it rests on, an interval from the
    calibration's recent errors, and the runtime settings its workers get (checkpoint interval,
    overlap, streamed fragments). Raises contracts.errors.NoFeasiblePlan, whose
    details['explanation'] lists which constraint removed what, when nothing is feasible.

    With ``data.shards`` every region holding a resident shard gets a replica; ``staging`` (the
    sizes and rates the control plane resolved) prices each option's staging and its egress.
    """
    if max_options < 1:
        raise InvalidArgument("max_options must be at least 1", field="max_options")
    return _search(spec, snapshot, calibration, max_options, staging)


def prepare(snapshot: ResourceSnapshot) -> None:
    """Derive now what every quote on this snapshot reuses: its pools at both price settings,
    and their classes (which a filtered pool list mostly reuses whole: ``problem._classes``).

    A server calls it once its fleet is loaded (off the quote path), so that no quote pays for
    grouping 40,000 devices; what a later change touches is regrouped per cluster. Options do not
    depend on whether it was called.
    """
    for spot in (False, True):
        prepare_classes(snapshot, prepare_pools(snapshot, spot))
