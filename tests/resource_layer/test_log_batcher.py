"""The batcher between the agents' streams and ``task_logs``: one write per flush, lines kept only
under their own node's tasks, a counted marker for lines it could not hold, rotation across
flushes, a notice per job on the bus after the commit; and the reaper's retention pass. On SQLite
with the in-process bus and on PostgreSQL with Redis."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from sqlalchemy import select

from contracts.errors import InvalidArgument
from control_layer.reaper import prune_logs_once
from orchestration.context import ServerContext
from orchestration.db.base import utcnow
from orchestration.db.models import Task
from orchestration.logs import store
from resource_layer.log_batcher import TaskLogBatcher
from tests.orchestration.test_task_logs import job_with_tasks


def _with(ctx: ServerContext, **settings: object) -> ServerContext:
    return dataclasses.replace(ctx, settings=ctx.settings.model_copy(update=settings))


def _node_of(ctx: ServerContext, task_id: str) -> str:
    with ctx.session_factory() as s:
        return s.scalars(select(Task.node_id).where(Task.id == task_id)).one()


def _lines(ctx: ServerContext, job_id: str, task_id: str | None = None) -> list[store.LogRow]:
    with ctx.session_factory() as s:
        return store.read(s, job_id, task_id=task_id, limit=10_000)


def test_a_full_queue_drops_lines_into_a_counted_marker_and_strangers_lines_are_not_kept(
    ctx: ServerContext,
) -> None:
    ctx = _with(ctx, log_max_pending_lines=100)
    job_id, (task_id, _) = job_with_tasks(ctx.session_factory)
    node_id = _node_of(ctx, task_id)

    async def run() -> tuple[list[tuple[str, dict]], int]:
        batcher = TaskLogBatcher(ctx)
        batcher.add("some-other-node", task_id, "stdout", "not this node's task")
        batcher.add(node_id, "no-such-task", "stdout", "no task")
        await batcher.flush()
        assert not _lines(ctx, job_id) and batcher.written == 0
        async with ctx.bus.subscribe(store.logs_channel(job_id)) as notices:
            for i in range(250):  # no await in between: the flusher cannot run, the queue fills
                batcher.add(node_id, task_id, "stdout", f"line {i}")
            await batcher.flush()
            heard = [await asyncio.wait_for(anext(notices), 10)]
            await batcher.close()
        return heard, batcher.written

    heard, written = asyncio.run(run())
    rows = _lines(ctx, job_id)
    assert [r.line for r in rows[:100]] == [f"line {i}" for i in range(100)]
    marker = rows[100]
    assert len(rows) == 101 == written
    assert (marker.stream, marker.dropped) == ("cpn", 150)
    assert marker.line.startswith("[cpn] 150 lines dropped")
    # one notice for the flush, naming the newest seq, sent after the commit
    assert heard == [(store.logs_channel(job_id), {"kind": "task.logs", "job_id": job_id, "seq": marker.seq})]


def test_rotation_across_flushes_keeps_the_bound(ctx: ServerContext) -> None:
    ctx = _with(ctx, log_max_lines_per_task=40)
    job_id, (a, b) = job_with_tasks(ctx.session_factory)
    node_id = _node_of(ctx, a)

    async def run() -> None:
        batcher = TaskLogBatcher(ctx)
        for flush in range(10):
            for i in range(15):
                batcher.add(node_id, a, "stdout", f"a {flush * 15 + i}")
            batcher.add(node_id, b, "stderr", f"b {flush}")
            await batcher.flush()
            assert len(_lines(ctx, job_id, a)) <= 40
        await batcher.close()

    asyncio.run(run())
    rows = _lines(ctx, job_id, a)
    assert rows[0].dropped == 150 - (len(rows) - 1) and rows[-1].line == "a 149"
    assert [r.line for r in _lines(ctx, job_id, b)] == [f"b {i}" for i in range(10)]


def test_the_reapers_retention_pass_removes_only_long_ended_jobs_lines(ctx: ServerContext) -> None:
    ctx = _with(ctx, log_retention_days=2.0)
    old, (old_task,) = job_with_tasks(ctx.session_factory, 1, finished_days_ago=3)
    recent, (recent_task,) = job_with_tasks(ctx.session_factory, 1, finished_days_ago=1)
    with ctx.session_factory() as s, s.begin():
        for job, task in ((old, old_task), (recent, recent_task)):
            store.append(s, [store.new_line(job, task, "stdout", "x", utcnow())])
    assert prune_logs_once(ctx) == 1
    assert not _lines(ctx, old) and len(_lines(ctx, recent)) == 1
    assert prune_logs_once(ctx) == 0


def test_lines_are_cut_on_arrival_and_only_the_agents_streams_are_taken(ctx: ServerContext) -> None:
    job_id, (task_id, _) = job_with_tasks(ctx.session_factory)
    node_id = _node_of(ctx, task_id)

    async def run() -> None:
        batcher = TaskLogBatcher(ctx)
        batcher.add(node_id, task_id, "stderr", "x" * 1_000_000)
        assert len(batcher._pending[0].line) == store.MAX_LINE_CHARS  # noqa: SLF001 - what waits in memory
        with pytest.raises(InvalidArgument, match="log.stream"):
            batcher.add(node_id, task_id, "cpn", "[cpn] 1000000 older lines rotated out")  # no forged markers
        await batcher.close()

    asyncio.run(run())
    (row,) = _lines(ctx, job_id)
    assert (row.stream, len(row.line), row.dropped) == ("stderr", store.MAX_LINE_CHARS, 0)
