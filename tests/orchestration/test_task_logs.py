"""Workers' log lines per task: the rotation policy (pure) and the table's bounds, markers, reads
and retention, on SQLite and on PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from orchestration.db.base import new_id, utcnow
from orchestration.db.models import Cluster, Job, Node, Provider, Region, Task, TaskLogLine, Tenant
from orchestration.logs import store
from orchestration.logs.rotation import MARKER_BYTES, LogBounds, over, rotation_cut


def test_cut_keeps_the_newest_lines_within_the_low_water_mark() -> None:
    bounds = LogBounds(max_lines=10, max_bytes=10_000)
    rows = [(seq, 10) for seq in range(20, 0, -1)]  # newest first
    # keep 9 with the marker: the 8 newest (20..13) stay, 12 becomes the marker, 11..1 go
    assert rotation_cut(rows, bounds) == 12
    assert rotation_cut(rows[:8], bounds) is None
    assert over(11, 0, bounds) and not over(10, 10_000, bounds) and over(1, 10_001, bounds)


def test_cut_by_bytes_reserves_room_for_the_marker() -> None:
    bounds = LogBounds(max_lines=1000, max_bytes=1000)  # keep 900 bytes, 780 of lines
    rows = [(seq, 100) for seq in range(30, 0, -1)]
    assert rotation_cut(rows, bounds) == 23  # 30..24: 700 bytes; one more would be 800 > 780
    assert rotation_cut([(5, 781)], bounds) == 5  # a single line over the room goes too


def test_bounds_refuse_sizes_that_cannot_hold_a_line_and_a_marker() -> None:
    with pytest.raises(ValueError):
        LogBounds(max_lines=1, max_bytes=10_000)
    with pytest.raises(ValueError):
        LogBounds(max_lines=10, max_bytes=MARKER_BYTES)


def job_with_tasks(factory: sessionmaker[Session], n: int = 2, finished_days_ago: float | None = None):  # noqa: ANN202
    with factory() as s, s.begin():
        tenant = Tenant(name=f"t-{new_id()}")
        if s.get(Region, "eu-west") is None:
            s.add(Region(name="eu-west", jurisdiction="EU"))
        provider = Provider(name=f"p-{new_id()}")
        s.add_all([tenant, provider])
        s.flush()
        cluster = Cluster(name=f"c-{new_id()}", region="eu-west", provider_id=provider.id)
        s.add(cluster)
        s.flush()
        node = Node(cluster_id=cluster.id, hostname="h", token_hash="x")
        s.add(node)
        s.flush()
        job = Job(tenant_id=tenant.id, name="j", spec={}, status="running")
        if finished_days_ago is not None:
            job.status, job.finished_at = "succeeded", utcnow() - timedelta(days=finished_days_ago)
        s.add(job)
        s.flush()
        tasks = []
        for _ in range(n):
            t = Task(
                job_id=job.id, attempt=0, cluster_id=cluster.id, node_id=node.id, region="eu-west",
                device_indices=[0], placement=[], worker_config={},
            )  # fmt: skip
            s.add(t)
            s.flush()
            tasks.append(t.id)
        return job.id, tasks


def _append(factory: sessionmaker[Session], job_id: str, task_id: str, texts: list[str]) -> int:
    """Append in one transaction; the job's newest seq after it."""
    with factory() as s, s.begin():
        store.append(s, [store.new_line(job_id, task_id, "stdout", t, utcnow()) for t in texts])
        return store.newest(s, [job_id])[job_id]


def test_rotation_keeps_each_task_within_its_bounds_with_a_counting_marker(
    session_factory: sessionmaker[Session],
) -> None:
    job_id, (a, b) = job_with_tasks(session_factory)
    bounds = LogBounds(max_lines=50, max_bytes=1 << 20)
    _append(session_factory, job_id, b, ["other task"] * 5)
    for batch in range(4):  # 4 x 30 lines, rotated whenever over the bound, as the writer does
        _append(session_factory, job_id, a, [f"line {batch * 30 + i}" for i in range(30)])
        with session_factory() as s, s.begin():
            lines, nbytes = store.sizes(s, [a])[a]
            if over(lines, nbytes, bounds):
                assert store.rotate(s, a, bounds) == store.sizes(s, [a])[a]
    with session_factory() as s:
        rows = store.read(s, job_id, task_id=a, limit=1000)
        assert len(rows) <= 50
        marker, kept = rows[0], rows[1:]
        assert marker.stream == "cpn" and marker.dropped == 120 - len(kept)
        assert marker.line == f"[cpn] {marker.dropped} older lines rotated out"
        assert [r.line for r in kept] == [f"line {i}" for i in range(120 - len(kept), 120)]  # the newest
        # the other task is untouched
        assert [r.line for r in store.read(s, job_id, task_id=b)] == ["other task"] * 5


def test_rotation_by_bytes(session_factory: sessionmaker[Session]) -> None:
    job_id, (a, _) = job_with_tasks(session_factory)
    bounds = LogBounds(max_lines=10_000, max_bytes=64 * 1024)
    for _ in range(5):
        _append(session_factory, job_id, a, ["é" * 1000] * 10)  # 2,000 bytes a line (UTF-8)
        with session_factory() as s, s.begin():
            lines, nbytes = store.sizes(s, [a])[a]
            if over(lines, nbytes, bounds):
                store.rotate(s, a, bounds)
    with session_factory() as s:
        lines, nbytes = store.sizes(s, [a])[a]
        assert nbytes <= 64 * 1024 and lines < 50
        total = s.scalar(select(func.sum(TaskLogLine.dropped)).where(TaskLogLine.task_id == a))
        assert total + lines - 1 == 50  # the marker counts every line it replaced


def test_a_second_rotation_carries_the_earlier_markers_count(session_factory: sessionmaker[Session]) -> None:
    job_id, (a, _) = job_with_tasks(session_factory)
    bounds = LogBounds(max_lines=10, max_bytes=1 << 20)
    for round_ in range(3):
        _append(session_factory, job_id, a, [f"r{round_} {i}" for i in range(20)])
        with session_factory() as s, s.begin():
            store.rotate(s, a, bounds)
    with session_factory() as s:
        rows = store.read(s, job_id, task_id=a)
        assert rows[0].dropped == 60 - (len(rows) - 1) and sum(r.dropped > 0 for r in rows) == 1


def test_read_interleaves_tasks_by_seq_with_tail_after_and_limit(
    session_factory: sessionmaker[Session],
) -> None:
    job_id, (a, b) = job_with_tasks(session_factory)
    after_a = _append(session_factory, job_id, a, ["a0", "a1"])
    after_b = _append(session_factory, job_id, b, ["b0"])
    after_a2 = _append(session_factory, job_id, a, ["a2"])
    with session_factory() as s:
        assert [r.line for r in store.read(s, job_id)] == ["a0", "a1", "b0", "a2"]
        seqs = [r.seq for r in store.read(s, job_id)]
        assert seqs == sorted(seqs) and (seqs[1], seqs[2], seqs[3]) == (after_a, after_b, after_a2)
        sa = seqs[:2]
        assert {r.region for r in store.read(s, job_id)} == {"eu-west"}
        assert [r.line for r in store.read(s, job_id, tail=2)] == ["b0", "a2"]
        assert [r.line for r in store.read(s, job_id, after=sa[1])] == ["b0", "a2"]
        assert [r.line for r in store.read(s, job_id, limit=1, after=sa[0])] == ["a1"]
        assert [r.line for r in store.read(s, job_id, task_id=a, tail=2)] == ["a1", "a2"]


def test_lines_are_cut_to_the_column_and_counted_in_bytes() -> None:
    line = store.new_line("j", "t", "a-very-long-stream-name", "ü" * 5000, utcnow())
    assert len(line.line) == store.MAX_LINE_CHARS and line.nbytes == 2 * store.MAX_LINE_CHARS
    assert line.stream == "a-very-long-stre"


def test_retention_prunes_only_jobs_ended_before_the_cutoff(session_factory: sessionmaker[Session]) -> None:
    old_job, (old_task,) = job_with_tasks(session_factory, 1, finished_days_ago=10)
    new_job, (new_task,) = job_with_tasks(session_factory, 1, finished_days_ago=1)
    live_job, (live_task,) = job_with_tasks(session_factory, 1)
    for job, task in ((old_job, old_task), (new_job, new_task), (live_job, live_task)):
        _append(session_factory, job, task, ["x", "y"])
    with session_factory() as s, s.begin():
        assert store.prune_ended(s, utcnow() - timedelta(days=7)) == 2
    with session_factory() as s:
        assert not store.read(s, old_job)
        assert len(store.read(s, new_job)) == len(store.read(s, live_job)) == 2
