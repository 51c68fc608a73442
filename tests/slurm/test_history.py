"""How long a Slurm cluster's jobs really run against their limits (pure), and the queue wait it
gives, on outputs recorded from the one-node test cluster under other users' jobs of a minute's
limit that slept 15-40 s: ``squeue -o %T|%S|%e|%C|%b|%l|%u|%j`` and the ``jobcomp/filetxt`` file
at 15:26:33."""

from __future__ import annotations

import statistics
from datetime import datetime
from pathlib import Path

import pytest

from agent.slurm_history import (
    OWN,
    Ended,
    JobcompFollower,
    Runtimes,
    ended_from_jobcomp,
    ended_from_sacct,
    job_kind,
)
from agent.slurm_queue import QueuedJob, parse_squeue, queue_wait_estimate

RECORDED = Path(__file__).parent / "recorded"
# A job its owner cancelled while it was pending: jobcomp records it with no node.
NEVER_RAN = (
    "JobId=52 UserId=root(0) GroupId=root(0) Name=wrap JobState=CANCELLED Partition=debug TimeLimit=1 "
    "StartTime=2026-11-29T15:30:53 EndTime=2026-11-29T15:30:53 NodeList=(null) NodeCnt=0 ProcCnt=3 "
    "WorkDir=/work ReservationName= Tres=cpu=3,mem=8G,node=1,billing=3 Account= QOS= WcKey= "
    "Cluster=unknown SubmitTime=2026-11-29T15:25:10 EligibleTime=2026-11-29T15:25:10 "
    "DerivedExitCode=0:0 ExitCode=0:0"
)
NOW = datetime(2026, 11, 29, 15, 26, 33).timestamp()
USER = "user:root"


def _recorded() -> tuple[list[QueuedJob], Runtimes]:
    jobs = parse_squeue((RECORDED / "squeue_at_152633.txt").read_text(), gpus=False)
    runtimes = Runtimes()
    runtimes.add(ended_from_jobcomp((RECORDED / "jobcomp_at_152633.txt").read_text()))
    return jobs, runtimes


def test_ended_jobs_are_read_per_kind_cpns_own_apart() -> None:
    ended = ended_from_jobcomp((RECORDED / "jobcomp_at_152633.txt").read_text())
    users = [e for e in ended if e.kind == USER]
    own = [e for e in ended if e.kind == OWN]
    assert len(users) + len(own) == len(ended) == 26  # every record had started
    assert {e.limit_s for e in users} == {60.0} and all(15 <= e.runtime_s <= 40 for e in users)
    assert {e.limit_s for e in own} == {600.0, 2880.0}  # the quote's margin, at least 10 minutes
    # sacct's lines, where accounting is on; a job cancelled while pending never started.
    out = (
        "alice|2026-11-29T12:00:00|2026-11-29T12:30:00|02:00:00|gpu01|train|x\n"
        "bob|2026-11-29T12:00:00|2026-11-29T12:00:00|1:00|None assigned|b\n"
    )
    assert ended_from_sacct(out) == [Ended("user:alice", 1800.0, 7200.0)]
    assert ended_from_jobcomp(NEVER_RAN) == []
    assert job_kind("svc", "cpn-abc") == OWN and job_kind("svc", "train") == "user:svc"


def test_a_running_job_is_expected_to_end_as_jobs_like_it_that_ran_as_long_did() -> None:
    _, runtimes = _recorded()
    runs = sorted(runtimes.runs(USER, 60.0))
    start = NOW - 10
    # Just started: the median of its kind's runs; past most of them, the median of the longer.
    assert runtimes.end_of_running(USER, start, 60.0, start) == start + statistics.median(runs)
    assert runtimes.end_of_running(USER, start, 60.0, start + 34) == start + statistics.median(
        [r for r in runs if r > 34]
    )
    # Past every recorded run: its limit bounds it.
    assert runtimes.end_of_running(USER, start, 60.0, start + 45) == start + 60.0
    # A user's runs scale with the limit; a user not seen yet takes the others'.
    assert runtimes.runtime(USER, 120.0) == pytest.approx(2 * statistics.median(runs))
    assert runtimes.runtime("user:carol", 60.0) == statistics.median(runs)
    # cpn's own tasks ran as they ran, whatever their limits; nothing known: the limit.
    own = sorted(runtimes.runs(OWN, 10_680.0))
    assert runtimes.runtime(OWN, 10_680.0) == statistics.median(own) < 120
    assert Runtimes().runtime(OWN, 600.0) == 600.0 and Runtimes().runtime(USER, 60.0) == 60.0


def test_the_recorded_queue_is_priced_by_how_jobs_ran_not_by_their_limits() -> None:
    """Behind 37 pending jobs (five cpn tasks of 3- and 7-hour limits among them) on 8 busy CPUs:
    by the limits, hours; by the runs, minutes. (Recorded: 260 s later, when the run ended, the
    cluster had still not started the last 18 of the jobs ahead.)"""
    jobs, runtimes = _recorded()
    free = 8 - sum(j.slots for j in jobs if j.state == "RUNNING")
    assert free == 0 and sum(j.state == "PENDING" for j in jobs) == 37
    by_limits = queue_wait_estimate(jobs, free=free, need=1, history=[], now=NOW)
    by_runs = queue_wait_estimate(jobs, free=free, need=1, history=[], now=NOW, runtimes=runtimes)
    assert by_limits > 3 * 3600 and 260 < by_runs < 600


def test_the_jobcomp_file_is_followed_as_it_grows(tmp_path: Path) -> None:
    path = tmp_path / "jobcomp.txt"
    lines = (RECORDED / "jobcomp_at_152633.txt").read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:3]) + lines[3][:40])  # the controller mid-write
    follower = JobcompFollower(str(path))
    assert len(ended_from_jobcomp(follower.read_new())) == 3
    assert follower.read_new() == ""
    with path.open("a") as f:
        f.write(lines[3][40:] + lines[4])
    assert [e.runtime_s for e in ended_from_jobcomp(follower.read_new())] == [16.0, 16.0]
    path.write_text(lines[5])  # rotated: read from its start
    assert len(ended_from_jobcomp(follower.read_new())) == 1
    assert JobcompFollower(str(tmp_path / "absent")).read_new() == ""
