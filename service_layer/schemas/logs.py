"""Workers' log lines as the API returns them."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from service_layer.schemas.common import ApiModel


class LogLine(ApiModel):
    seq: int = Field(description="Position in the job's lines (every task's together); the cursor")
    task_id: str
    region: str
    time: datetime = Field(description="When the control plane received the line")
    stream: str = Field(description="stdout | stderr | agent (the node's own notes) | cpn (markers)")
    line: str
    dropped: int = Field(0, description="> 0: a marker standing for this many lines not kept")


class LogPage(ApiModel):
    job_id: str
    status: str = Field(description="The job's status when the lines were read")
    lines: list[LogLine]
    next_after: int = Field(description="Pass as `after` to read on from here")
    more: bool = Field(description="True when `limit` cut the page short: read on with `after`")


LOG_EXAMPLE = {
    "job_id": "0f9c2d7e4b1a4c55a3e1f2b6c7d8e9f0",
    "status": "running",
    "lines": [
        {
            "seq": 4181,
            "task_id": "5a1e9c0d7f3b4e2a9c8d7e6f5a4b3c2d",
            "region": "eu-west",
            "time": "2026-11-25T00:41:07.512Z",
            "stream": "stdout",
            "line": "resumed from step 200 (own checkpoint)",
            "dropped": 0,
        }
    ],
    "next_after": 4181,
    "more": False,
}
