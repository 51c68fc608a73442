"""When a run writes its periodic checkpoints: every ``every`` steps of the job's progress.

With balanced rounds (``training.sync.algorithms.round_plan``) each region runs its own step count,
so a local step's multiples of ``every`` fall at a different point of each round in each region.
The final round is split again halfway from each region's pace over its first half: a region whose
checkpoint (its writing overlaps the next steps and slows them) fell in that half reported a pace
its second half beat, was given too few steps and reached the final blocking exchange early, while
one whose checkpoint fell after halfway came late. On the job's step axis every region checkpoints
at the same point of each round, so such a cost falls in the same half everywhere. Without balanced
rounds the job's step is the local step and this is every ``every``-th step.
"""

from __future__ import annotations

import math

_EPS = 1e-9  # the job's step is a float (a fraction of a round); an exact multiple may round below


class PeriodicCheckpoints:
    def __init__(self, every: int, job_step: float) -> None:
        """``job_step``: where the run starts (a resumed run's first due point is past it)."""
        self.every = every
        self.next_at = self._after(job_step) if every > 0 else math.inf

    def _after(self, job_step: float) -> float:
        return (math.floor(job_step / self.every + _EPS) + 1) * self.every

    def due(self, job_step: float) -> bool:
        """Whether the step that brought the job to ``job_step`` is checkpointed (at most once per
        multiple of ``every`` passed: the plan's re-splits may move a step's job position)."""
        if job_step + _EPS < self.next_at:
            return False
        self.next_at = self._after(job_step)
        return True
