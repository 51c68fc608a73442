"""What a worker reports, and how it appears in its output.

The worker prints ``CPN_METRIC {json}`` per step (leader only) and one ``CPN_RESULT {json}`` at the
end; the agent forwards both, and the control plane stores them. ``StepMetrics`` names the fields
every layer reads; a worker may add more (sync details, per-region bytes), which pass through.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

METRIC_PREFIX = "CPN_METRIC "
RESULT_PREFIX = "CPN_RESULT "


class StepMetrics(BaseModel):
    """One step's record as the control plane stores it (``TaskMetric`` rows)."""

    model_config = ConfigDict(extra="allow")

    step: int = Field(ge=0)
    loss: float | None = None
    tokens_per_s: float = Field(default=0.0, ge=0)
    compute_utilization: float = Field(default=0.0, ge=0)
    wan_bytes_sent: int = Field(default=0, ge=0)
    wan_bytes_recv: int = Field(default=0, ge=0)


def parse_lines(text: str, prefix: str = METRIC_PREFIX) -> list[dict[str, Any]]:
    """The JSON payloads of every ``prefix`` line in a worker's output (what the agent does)."""
    return [json.loads(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix)]
