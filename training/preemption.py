"""Checkpoint on demand when the job is preempted.

The agent creates ``WorkerConfig.preempt_file`` when the control plane preempts the job. Every
rank looks for the file once per step, and the ranks agree on it through the step's loss
all-reduce (the flag rides along as a second element: no collective is added), so all of them
stop after the same step. The train loop then checkpoints that step and exits cleanly with a
result saying it was preempted. At most the step in flight when the order came is redone.
"""

from __future__ import annotations

from pathlib import Path


class PreemptWatch:
    """Whether this rank has been asked to stop (a file check: a few microseconds a step)."""

    def __init__(self, path: str | None) -> None:
        self.path = Path(path) if path else None

    def asked(self) -> bool:
        return self.path is not None and self.path.exists()
