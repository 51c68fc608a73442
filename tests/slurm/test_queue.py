"""The queue wait a Slurm-backed agent reports (pure): the scheduler's latency where there is
room, else until running jobs free the slots the pending jobs and the task want: by their limits
without a record of ended jobs, as jobs like them ran with one."""

from __future__ import annotations

from datetime import datetime

from agent.slurm_queue import (
    MAX_QUEUE_WAIT_S,
    QueuedJob,
    coarse_wait_s,
    limit_seconds,
    parse_squeue,
    queue_wait_estimate,
)

NOW = datetime(2026, 11, 29, 12, 0, 0).timestamp()


def test_with_room_the_wait_is_the_schedulers_own_latency() -> None:
    assert queue_wait_estimate([], free=8, need=1, history=[], now=NOW) == 0.0
    assert queue_wait_estimate([], free=8, need=1, history=[0.4, 3.0, 0.6], now=NOW) == 0.6


def test_without_room_the_task_waits_for_the_jobs_ahead_and_the_limits_that_free_its_slots() -> None:
    running = [QueuedJob("RUNNING", 4, NOW + 600), QueuedJob("RUNNING", 4, NOW + 120)]
    assert queue_wait_estimate(running, free=0, need=2, history=[1.0], now=NOW) == 121.0
    # A pending 4-CPU job is ahead: the first end frees 4, the task's 2 wait for the second.
    ahead = [*running, QueuedJob("PENDING", 4, None)]
    assert queue_wait_estimate(ahead, free=0, need=2, history=[], now=NOW) == 600.0
    # A pending job of a minute starts at +120 s and frees its 4 slots at +180 s; the backfill
    # scheduler's own start for it caps that (Slurm plans with limits: its start is one at the
    # latest), a later one changes nothing.
    unplanned = [*running, QueuedJob("PENDING", 4, None, 60.0)]
    assert queue_wait_estimate(unplanned, free=0, need=4, history=[], now=NOW) == 180.0
    planned = [*running, QueuedJob("PENDING", 4, NOW + 60, 60.0)]
    assert queue_wait_estimate(planned, free=0, need=4, history=[], now=NOW) == 120.0
    late = [*running, QueuedJob("PENDING", 4, NOW + 900, 60.0)]
    assert queue_wait_estimate(late, free=0, need=4, history=[], now=NOW) == 180.0
    # No limit known (an unlimited job): a day.
    assert (
        queue_wait_estimate([QueuedJob("RUNNING", 8, None)], free=0, need=1, history=[], now=NOW) == 86400.0
    )
    # A limit beyond what the control plane takes (a month): the most it takes.
    long_limit = QueuedJob("RUNNING", 8, NOW + 90 * 86400.0, 90 * 86400.0, started=NOW)
    assert queue_wait_estimate([long_limit], free=0, need=1, history=[], now=NOW) == MAX_QUEUE_WAIT_S


def test_jobs_ahead_start_in_turn_and_free_their_slots_at_their_limits() -> None:
    """8 slots held until +60 s; three pending 4-slot jobs of a minute: two start at +60 s, the
    third when those end at +120 s, beside it room for the task then."""
    running = [QueuedJob("RUNNING", 4, NOW + 60), QueuedJob("RUNNING", 4, NOW + 60)]
    ahead = [QueuedJob("PENDING", 4, None, 60.0) for _ in range(3)]
    assert queue_wait_estimate(running + ahead, free=0, need=1, history=[], now=NOW) == 120.0
    too_big = [*running, QueuedJob("PENDING", 16, None, 60.0)]  # more than the cluster ever frees
    assert queue_wait_estimate(too_big, free=0, need=1, history=[], now=NOW) == 86400.0


def test_squeue_lines_give_states_slots_and_times() -> None:
    out = (
        "PENDING|N/A|N/A|4|N/A|1:00|alice|train\n"
        "RUNNING|2026-11-29T12:00:00|2026-11-29T12:05:00|8|N/A|5:00|bob|a|b\n"
        "RUNNING|2026-11-29T11:00:00|UNLIMITED|2|gres/gpu:2|UNLIMITED|svc|cpn-42\n"
        "RUNNING|2026-11-29T11:00:00|2027-11-29T11:00:00|2|N/A|UNLIMITED|carol|e\n"
        "COMPLETING|2026-11-29T11:59:00|2026-11-29T12:00:00|1|N/A|1|bob|c\n"
        "CONFIGURING|x|y|1|N/A|1|bob|d\n"
    )
    assert parse_squeue(out, gpus=False) == [
        QueuedJob("PENDING", 4, None, 60.0, kind="user:alice"),
        QueuedJob("RUNNING", 8, NOW + 300, 300.0, started=NOW, kind="user:bob"),
        QueuedJob("RUNNING", 2, None, None, started=NOW - 3600, kind="cpn"),
        # unlimited, Slurm's end for it a year on: no end known (``running_end`` assumes a day)
        QueuedJob("RUNNING", 2, None, None, started=NOW - 3600, kind="user:carol"),
        QueuedJob("COMPLETING", 1, NOW, 60.0, started=NOW - 60, kind="user:bob"),
    ]
    assert [limit_seconds(t) for t in ("1-02:00:00", "30", "10:00", "N/A")] == [93600.0, 1800.0, 600.0, None]
    assert [j.slots for j in parse_squeue(out, gpus=True)] == [0, 0, 2, 0, 0]
    # A completing job's slot is free for the queue now.
    completing = [QueuedJob("COMPLETING", 1, NOW - 5, 60.0), QueuedJob("RUNNING", 7, NOW + 60)]
    assert queue_wait_estimate(completing, free=0, need=1, history=[], now=NOW) == 0.0


def test_waits_are_reported_on_a_coarse_grid() -> None:
    assert [coarse_wait_s(s) for s in (0.2, 0.3, 7.74, 123.4, 2871.0)] == [0.0, 0.5, 7.5, 120.0, 2900.0]
    assert coarse_wait_s(MAX_QUEUE_WAIT_S) == MAX_QUEUE_WAIT_S  # two digits would round it up past the bound
