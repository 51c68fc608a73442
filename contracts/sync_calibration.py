"""A sync calibration's result: held-out loss of a codec/overlap setting against fp32 blocking at
the same H, measured on a job's own model and data (``training.calibration``, run by
``cpn calibrate``). It travels in the job spec (``sync.calibration``); the planner chooses the
codec and overlap from it and the quote shows the measured penalty (``planner.calibrated``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

TrialCodec = Literal["none", "fp16", "bf16", "int8"]
MAX_TRIALS = 16
LOSS_TOLERANCE = 0.005  # relative held-out loss a cheaper codec or overlap may add
Z_ONE_SIDED_95 = 1.645


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class CalibrationTrial(_Strict):
    """One setting against fp32 blocking: the ratio of their held-out losses after the same steps
    from the same start on the same data, and its standard error over paired held-out batches."""

    compression: TrialCodec
    overlap: bool
    delay: int = Field(default=0, ge=0, le=1_000_000, description="Steps an overlapped round landed late.")
    merge: Literal["progress", "mix"] | None = Field(default=None, description="How it landed (overlapped).")
    loss_ratio: float = Field(gt=0.5, lt=2.0, description="Held-out loss over fp32 blocking's.")
    stderr: float = Field(ge=0, lt=1.0, description="Standard error of loss_ratio (paired batches).")

    def passes(self, tolerance: float = LOSS_TOLERANCE) -> bool:
        """Its upper one-sided 95 % bound within ``tolerance``: a penalty the calibration cannot
        tell from the tolerance is not taken."""
        return self.loss_ratio + Z_ONE_SIDED_95 * self.stderr <= 1 + tolerance

    @model_validator(mode="after")
    def _delay_with_overlap(self) -> CalibrationTrial:
        if not self.overlap and (self.delay or self.merge):
            raise ValueError("delay and merge are only for an overlapped trial")
        return self


class SyncCalibration(_Strict):
    """Trials on a slice of the job: ``steps`` steps from its start, ``regions`` simulated regions
    syncing every ``every`` steps, the final models compared on ``heldout_batches`` batches."""

    mode: Literal["diloco", "local_sgd"] = "diloco"
    every: int = Field(ge=1, le=1_000_000)
    steps: int = Field(ge=1, le=1_000_000)
    regions: int = Field(ge=2, le=64)
    heldout_batches: int = Field(ge=2, le=100_000)
    seconds: float = Field(ge=0, le=1e7, description="Wall time the calibration took.")
    trials: list[CalibrationTrial] = Field(min_length=1, max_length=MAX_TRIALS)

    @model_validator(mode="after")
    def _rounds(self) -> SyncCalibration:
        if self.steps < self.every:
            raise ValueError(f"steps ({self.steps}) must cover at least one round of every={self.every}")
        seen = [(t.compression, t.overlap) for t in self.trials]
        if len(set(seen)) != len(seen):
            raise ValueError("one trial per (compression, overlap)")
        return self

    def trial(self, compression: str, overlap: bool) -> CalibrationTrial | None:
        return next((t for t in self.trials if (t.compression, t.overlap) == (compression, overlap)), None)
