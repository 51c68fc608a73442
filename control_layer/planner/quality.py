"""What a sync setting costs in model quality, for quotes: held-out loss at equal tokens over
synchronous data parallelism (mode ``sync``), as measured by ``benchmarks/sync_quality.py``
(BENCHMARKS.md at dabf7f7, "Sync quality", 2026-11-24: 3 regions at 100 Mbit/s, a 1.34M-parameter GPT,
300 steps of 1,024 tokens per region). Overlapped rows ran as real jobs do: applied the control
plane's delay after sending (``sync_settings.overlap_delay``: one step there) with Streaming
DiLoCo's merge. One small workload: it gives the size and the direction of the trade-off, not a
promise for every model. Pure data in, data out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# (mode, H, compression, overlapped) -> held-out loss / sync's held-out loss (0.9416).
# The overlapped int8 row at H=100 streamed 5 fragments (Streaming DiLoCo).
MEASURED: dict[tuple[str, int, str, bool], float] = {
    ("sync", 1, "none", False): 1.0,
    ("diloco", 20, "none", False): 0.9305 / 0.9416,
    ("diloco", 20, "int8", True): 0.9331 / 0.9416,
    ("diloco", 100, "none", False): 0.9493 / 0.9416,
    ("diloco", 100, "int8", True): 0.9331 / 0.9416,
    ("local_sgd", 20, "none", False): 0.9601 / 0.9416,
    ("gossip", 10, "none", False): 0.9668 / 0.9416,
}


@dataclass(frozen=True)
class QualityEstimate:
    loss_ratio: float  # held-out loss over sync's at equal tokens (< 1: better than sync)
    measured_as: str  # the measured setting it comes from


def quality(mode: str, every: int, compression: str, overlap: bool = False) -> QualityEstimate | None:
    """The measured setting of the same mode, compression and overlap whose H is nearest (on a log
    scale) to ``every``; None when no such setting was measured."""
    if mode == "sync":
        return QualityEstimate(1.0, "sync")
    same = [k for k in MEASURED if k[0] == mode and k[2] == compression and k[3] == overlap]
    if not same:
        return None
    key = min(same, key=lambda k: (abs(math.log(k[1]) - math.log(max(1, every))), k[1]))
    m, h, c, o = key
    return QualityEstimate(MEASURED[key], f"{m} H={h} {c}{' overlapped' if o else ''}")
