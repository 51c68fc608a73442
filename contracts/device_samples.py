"""A GPU node's heartbeat report of its devices (utilisation, memory, power, temperature, health)
and the pure checks it passes before it is stored. A sample out of bounds is left out, named."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from datetime import datetime

MAX_SAMPLES = 1024  # as many as a node may have devices
MAX_REASON = 500
# (field, upper bound): a figure beyond it is no reading of a real device
BOUNDS = (
    ("utilization", 1.0),
    ("memory_used_gb", 100_000.0),
    ("power_w", 100_000.0),
    ("temperature_c", 200.0),
)


@dataclass(frozen=True)
class DeviceSample:
    index: int
    utilization: float  # 0..1
    memory_used_gb: float
    power_w: float
    temperature_c: float
    health: str = ""  # "": healthy; else the fault a health rule found


def sample_problems(s: DeviceSample, where: str) -> list[str]:
    out = (
        [] if 0 <= s.index < MAX_SAMPLES else [f"{where}.index: must be 0..{MAX_SAMPLES - 1}, got {s.index}"]
    )
    for name, hi in BOUNDS:
        v = getattr(s, name)
        if not (isinstance(v, int | float) and math.isfinite(v) and 0 <= v <= hi):
            out.append(f"{where}.{name}: must be a finite number in [0, {hi:g}], got {v}")
    if len(s.health) > MAX_REASON:
        out.append(f"{where}.health: at most {MAX_REASON} characters")
    return out


@dataclass(frozen=True)
class GpuReport:
    samples: tuple[DeviceSample, ...]
    node_health: str  # "": healthy; else why the whole node needs cordoning

    @property
    def cordon_reason(self) -> str:
        """Why the node is to be cordoned ("" when it is healthy): a node fault, else every device
        fault with its device."""
        if self.node_health:
            return self.node_health[:MAX_REASON]
        return "; ".join(f"device {s.index}: {s.health}" for s in self.samples if s.health)[:MAX_REASON]

    def as_dict(self, at: datetime) -> dict[str, object]:
        return {"at": at.isoformat(), "devices": [asdict(s) for s in self.samples]}


def checked_report(samples: list[DeviceSample], node_health: str) -> tuple[GpuReport, list[str]]:
    """The report with every sample that passes, and what was wrong with the others."""
    problems: list[str] = []
    kept = []
    for i, s in enumerate(samples[:MAX_SAMPLES]):
        found = sample_problems(s, f"heartbeat.devices[{i}]")
        problems += found
        if not found:
            kept.append(s)
    return GpuReport(tuple(kept), node_health[:MAX_REASON]), problems
