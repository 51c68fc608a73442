"""What a codec and overlap cost in held-out loss, and the choice of them, from a calibration on the
job's own model and data when the spec carries one (``sync.calibration``, measured by
``cpn calibrate``), else from the one-model table (``planner.quality``). Pure.

A calibration trial is a ratio to fp32 blocking at the same H, with its standard error over paired
held-out batches. A setting *passes* where its upper one-sided 95 % bound, ratio + 1.645 x stderr,
is within ``LOSS_TOLERANCE``: a penalty the calibration cannot tell from 0.5 % is not taken. The
codec chosen is the cheapest whose overlapped trial passes (DiLoCo overlaps); where none passes,
no compression, and, unless fp32 overlapped passed, blocking rounds. Without a calibration the
table's choice stands.

The penalty a quote shows carries where it comes from: ``measured`` (this job's calibration, an
interval from its standard error), ``table`` (one 1.34M-parameter model: no interval, the
confidence on another model is unknown), or ``reference`` (fp32 blocking is what is compared
against: no penalty by definition).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contracts.sync_calibration import LOSS_TOLERANCE, CalibrationTrial, SyncCalibration
from contracts.sync_config import OVERLAPPED_MODES
from control_layer.planner.quality import quality

Z_TWO_SIDED_95 = 1.96
CODEC_ORDER = ("int8", "bf16", "fp16", "none")  # cheapest first (top-k is never chosen unasked)
TABLE_NOTE = "from one 1.34M-parameter model (planner/quality.py), not this job's: confidence unknown"


@dataclass(frozen=True)
class Penalty:
    """Held-out loss over fp32 blocking at the same H, minus 1 (0.01: 1 % worse)."""

    value: float | None
    low: float | None  # 95 % interval; None where no interval is known
    high: float | None
    source: str  # measured | table | reference | unknown
    basis: str


def passes(trial: CalibrationTrial, tolerance: float = LOSS_TOLERANCE) -> bool:
    return trial.passes(tolerance)


def choose_codec(mode: str, calibration: SyncCalibration) -> tuple[str, str]:
    """The cheapest codec whose trial in the mode's overlap passes, and why; "none" where none does."""
    overlapped = mode in OVERLAPPED_MODES
    for codec in CODEC_ORDER:
        trial = calibration.trial(codec, overlapped)
        if codec == "none" or trial is None or not passes(trial):
            continue
        return codec, f"{codec}: measured {_measured(trial)} on this job (calibration, H={calibration.every})"
    failed = [f"{t.compression} {_measured(t)}" for t in calibration.trials if t.overlap == overlapped]
    return "none", f"none: no cheaper codec passed the calibration ({'; '.join(failed) or 'none tried'})"


def overlap_allowed(mode: str, compression: str, calibration: SyncCalibration | None) -> bool:
    """Whether the runtime may overlap the mode's exchange. With this job's calibration, only where
    the codec's overlapped trial passed: an unmeasured one is not vouched for (on gpt6-v512 int8
    overlapped failed, fp32 overlapped was left unmeasured by the budget, ran overlapped and cost
    0.85 %, more than int8's 0.49 %: the overlap, not the codec, was what cost). Its rounds then
    block: fp32 blocking is the reference itself."""
    if mode not in OVERLAPPED_MODES or calibration is None or mode == "async":
        return True
    trial = calibration.trial(compression, True)
    return trial is not None and passes(trial)


def _measured(trial: CalibrationTrial) -> str:
    return f"{trial.loss_ratio - 1:+.2%} ± {Z_TWO_SIDED_95 * trial.stderr:.2%}"


def penalty(
    mode: str, every: int, compression: str, overlap: bool, calibration: SyncCalibration | None
) -> Penalty:
    """The held-out loss penalty of (codec, overlap) against fp32 blocking at H=``every``."""
    codec = "none" if compression in ("fp32", "none") else compression
    if mode not in ("diloco", "local_sgd"):
        return Penalty(None, None, None, "unknown", f"{mode}: calibration covers DiLoCo and local SGD rounds")
    if codec == "none" and not overlap:
        return Penalty(0.0, 0.0, 0.0, "reference", "fp32 blocking: the reference")
    trial = calibration.trial(codec, overlap) if calibration is not None else None
    if trial is not None:
        assert calibration is not None
        half = Z_TWO_SIDED_95 * trial.stderr
        at = "" if calibration.every == every else f"; measured at H={calibration.every}, not {every}"
        basis = (
            f"measured on this job's model and data: {calibration.steps} steps over "
            f"{calibration.regions} regions, {calibration.heldout_batches} held-out batches{at}"
        )
        d = trial.loss_ratio - 1
        return Penalty(d, d - half, d + half, "measured", basis)
    mine, base = quality(mode, every, codec, overlap), quality(mode, every, "none", False)
    if mine is None or base is None:
        return Penalty(None, None, None, "unknown", "not measured for this setting")
    return Penalty(
        mine.loss_ratio / base.loss_ratio - 1, None, None, "table", f"{mine.measured_as}, {TABLE_NOTE}"
    )


def quality_fields(
    mode: str, every: int, compression: str, overlap: bool, calibration: SyncCalibration | None
) -> dict[str, Any]:
    """An option's sync quality as its ``SyncTopology`` states it: the table's ratio to sync and
    the penalty against fp32 blocking with where it comes from."""
    q = quality(mode, every, compression, overlap=overlap)
    p = penalty(mode, every, compression, overlap, calibration)
    return {
        "loss_ratio": None if q is None else q.loss_ratio,
        "loss_ratio_basis": "" if q is None else q.measured_as,
        "loss_penalty": p.value,
        "loss_penalty_low": p.low,
        "loss_penalty_high": p.high,
        "loss_penalty_source": p.source,
        "loss_penalty_basis": p.basis,
    }
