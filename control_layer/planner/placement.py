"""What an estimate prices: a job spec on a concrete task list, with its degrees and price settings."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from contracts.job_spec import JobSpec
from control_layer.planner.plan_types import Calibration, PlannedTask
from control_layer.planner.snapshot import ResourceSnapshot


@dataclass(frozen=True)
class Placement:
    """The input of ``estimate_option``, ``estimate_planned`` and ``replica_walks``: ``spec`` run
    on exactly ``tasks`` of ``snapshot`` as a dp × tp × pp grid at ZeRO stage ``zero``, its
    pipeline on ``pp_schedule``, its devices at spot prices where ``spot``, priced with
    ``calibration``'s factors (the defaults where None)."""

    spec: JobSpec
    snapshot: ResourceSnapshot
    tasks: Sequence[PlannedTask]
    dp: int
    tp: int
    pp: int
    zero: int
    pp_schedule: str = "1f1b"
    spot: bool = False
    calibration: Calibration | None = None

    def with_spec(self, spec: JobSpec) -> Placement:
        """The same placement of ``spec`` (the spec with its 'auto' choices resolved)."""
        return replace(self, spec=spec)
