"""Periodic checkpoints follow the job's progress, so balanced regions checkpoint at the same
point of each round (their local step counts differ)."""

from __future__ import annotations

from training.checkpoint_schedule import PeriodicCheckpoints
from training.sync.algorithms.round_plan import RoundPlan


def _checkpointed(every: int, job_steps: list[float], start: float = 0.0) -> list[int]:
    timer = PeriodicCheckpoints(every, start)
    return [i for i, js in enumerate(job_steps, start=1) if timer.due(js)]


def test_unbalanced_runs_checkpoint_every_nth_step_and_resume_past_the_start() -> None:
    assert _checkpointed(50, [float(s) for s in range(1, 201)]) == [50, 100, 150, 200]
    resumed = PeriodicCheckpoints(50, 37.0)
    assert [s for s in range(38, 160) if resumed.due(float(s))] == [50, 100, 150]
    assert not any(PeriodicCheckpoints(0, 0.0).due(float(s)) for s in range(1, 100))


def test_balanced_regions_checkpoint_at_the_same_point_of_the_final_round() -> None:
    # Five rounds of 100 steps; the final round (4) split 60 / 40 between a fast and a slow region
    # (earlier rounds even), then split again halfway. The fixed plan's checkpoint every 50 job
    # steps must land at the round's halfway point in both, not at local multiples of 50.
    plans = {}
    for me, share in (("a", 60), ("b", 40)):
        p = RoundPlan(me, 100, 500)
        for r in range(5):
            p.ends[r] = (p.ends[r - 1] if r else 0) + (share if r == 4 else 100)
        plans[me] = p
    got = {me: _checkpointed(50, [p.job_step(s) for s in range(1, p.ends[4] + 1)]) for me, p in plans.items()}
    assert got["a"][-3:] == [400, 430, 460]  # 430: halfway through a's 60 steps
    assert got["b"][-3:] == [400, 420, 440]
    # Local multiples of 50 would have put a's at 450 (three quarters in) and b's at 400 only.
    for me, p in plans.items():
        assert [p.job_step(s) for s in got[me][-2:]] == [450.0, 500.0]


def test_a_resplit_that_moves_the_job_position_back_does_not_checkpoint_twice() -> None:
    timer = PeriodicCheckpoints(50, 0.0)
    assert timer.due(50.2) and not timer.due(49.8) and not timer.due(50.5) and timer.due(100.0)
