"""What GET /v1/calibration returns: the planner's current calibration, its rows and their history."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from control_layer.planner.plan_types import Calibration


class FactorRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    kind: str = Field(description="efficiency | startup_s | goodput")
    key: str = Field(description='"model|precision", a node id, or "regionA|regionB"')
    value: float
    runs: int = Field(description="Finished runs that have moved it")
    updated_at: datetime


class ChangeRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    at: datetime
    job_id: str
    kind: str = Field(description="A factor kind, or time | cost for a job's quote error")
    key: str
    old: float | None
    new: float
    observed: float
    residual: float | None = Field(
        description="(observed − old) / old; for time/cost (actual − estimate) / estimate"
    )


class CalibrationRead(BaseModel):
    calibration: Calibration = Field(description="What every quote is planned with now")
    factors: list[FactorRead]
    history: list[ChangeRead] = Field(description="Newest first")
