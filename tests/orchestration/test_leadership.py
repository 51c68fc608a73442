"""Leader election on the database: one leader at a time, takeover after a silent lease or at once
after a release, and fencing that refuses every transaction of a deposed leader."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from sqlalchemy import event, text, update
from sqlalchemy.orm import Session, sessionmaker

from orchestration.db.engine import session_scope
from orchestration.db.models import LeaderLease
from orchestration.leadership import (
    SINGLETONS,
    Deposed,
    LeaseView,
    Watch,
    fenced,
    install_fence,
    lead_when_elected,
    read_lease,
    release,
    renew,
    try_acquire,
)


def _view(factory: sessionmaker[Session]) -> LeaseView | None:
    with factory() as s:
        return read_lease(s, SINGLETONS)


def test_watch_takes_over_only_after_a_full_lease_of_silence() -> None:
    w = Watch(lease_s=5.0)
    assert w.should_take_over(None, 0.0)  # nobody ever led
    assert w.should_take_over(LeaseView(3, 7, ""), 0.0)  # released
    held = LeaseView(3, 7, "r1")
    assert not w.should_take_over(held, 10.0)  # first sight starts the clock
    assert not w.should_take_over(held, 14.9)
    assert not w.should_take_over(LeaseView(3, 8, "r1"), 15.0)  # it beat: the clock restarts
    assert not w.should_take_over(LeaseView(3, 8, "r1"), 19.9)
    assert w.should_take_over(LeaseView(3, 8, "r1"), 20.0)


def test_acquire_renew_takeover_release(session_factory: sessionmaker[Session]) -> None:
    assert try_acquire(session_factory, SINGLETONS, "r1", None) == 1
    assert try_acquire(session_factory, SINGLETONS, "r2", None) is None  # the row exists: CAS lost
    assert renew(session_factory, SINGLETONS, "r1", 1)
    stale = LeaseView(1, 0, "r1")
    assert try_acquire(session_factory, SINGLETONS, "r2", stale) is None  # it beat since
    seen = _view(session_factory)
    assert seen == LeaseView(1, 1, "r1")
    assert try_acquire(session_factory, SINGLETONS, "r2", seen) == 2
    assert try_acquire(session_factory, SINGLETONS, "r3", seen) is None  # only one wins a takeover
    assert not renew(session_factory, SINGLETONS, "r1", 1)  # r1 learns it was deposed
    release(session_factory, SINGLETONS, "r1", 1)  # a deposed leader's release changes nothing
    assert _view(session_factory) == LeaseView(2, 0, "r2")
    release(session_factory, SINGLETONS, "r2", 2)
    assert _view(session_factory) == LeaseView(2, 0, "")


def test_fenced_transactions_of_a_deposed_leader_are_refused(session_factory: sessionmaker[Session]) -> None:
    install_fence(session_factory)
    assert try_acquire(session_factory, SINGLETONS, "r1", None) == 1
    with fenced(SINGLETONS, 1), session_scope(session_factory) as s:  # the leader writes
        s.execute(update(LeaderLease).values(holder="r1"))
    assert try_acquire(session_factory, SINGLETONS, "r2", _view(session_factory)) == 2
    with fenced(SINGLETONS, 1), pytest.raises(Deposed), session_scope(session_factory) as s:
        s.execute(update(LeaderLease).values(holder="late write"))
    assert _view(session_factory) == LeaseView(2, 0, "r2")
    with session_scope(session_factory) as s:  # outside a fence nothing is checked
        s.execute(text("SELECT 1"))


def test_the_fence_follows_tasks_and_threads_and_keeps_the_factorys_listeners(
    session_factory: sessionmaker[Session],
) -> None:
    install_fence(session_factory)
    heard: list[str] = []
    event.listen(session_factory, "after_commit", lambda s: heard.append("commit"))
    assert try_acquire(session_factory, SINGLETONS, "r1", None) == 1
    heard.clear()

    def write() -> None:
        with session_scope(session_factory) as s:
            s.execute(text("SELECT 1"))

    async def leader() -> None:
        await asyncio.to_thread(write)  # a singleton's work, as the reaper and placer do it

    async def main() -> None:
        with fenced(SINGLETONS, 1):
            task = asyncio.create_task(leader())
        await task
        assert heard == ["commit"]  # e.g. a change feed on the factory hears the leader's commits
        assert try_acquire(session_factory, SINGLETONS, "r2", _view(session_factory)) == 2
        with fenced(SINGLETONS, 1):
            task = asyncio.create_task(leader())
        with pytest.raises(Deposed):
            await task
        await asyncio.to_thread(write)  # this task never ran fenced

    asyncio.run(main())


@pytest.mark.postgres
def test_takeover_waits_for_the_leaders_transaction_in_flight(
    db_url: str, session_factory: sessionmaker[Session]
) -> None:
    if db_url.startswith("sqlite"):
        pytest.skip("SQLite serialises every write transaction already")
    assert try_acquire(session_factory, SINGLETONS, "r1", None) == 1
    seen = _view(session_factory)
    install_fence(session_factory)
    result: list[int | None] = []
    with fenced(SINGLETONS, 1), session_scope(session_factory) as s:
        s.execute(text("SELECT 1"))  # begun: the fence check holds the lease row FOR SHARE
        taker = threading.Thread(
            target=lambda: result.append(try_acquire(session_factory, SINGLETONS, "r2", seen))
        )
        taker.start()
        taker.join(0.5)
        assert taker.is_alive(), "the takeover did not wait for the fenced transaction"
    taker.join(10)
    assert result == [2]


def test_two_replicas_one_leader_then_failover(session_factory: sessionmaker[Session]) -> None:
    """Two electors in one loop: one runs the singletons; when it stops (released), the other leads."""
    running: list[str] = []

    def singletons(name: str):  # noqa: ANN202
        async def run(deposed: asyncio.Event) -> None:
            running.append(name)
            try:
                with session_scope(session_factory) as s:  # a fenced write works while leading
                    s.execute(update(LeaderLease).values(beat=LeaderLease.beat))
                await deposed.wait()
            finally:
                running.remove(name)

        return run

    async def main() -> None:
        stops = {"r1": asyncio.Event(), "r2": asyncio.Event()}
        tasks = {
            n: asyncio.create_task(
                lead_when_elected(session_factory, stops[n], singletons(n), holder=n, lease_s=0.5)
            )
            for n in stops
        }
        deadline = time.monotonic() + 10
        while not running:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        await asyncio.sleep(1.5)  # three leases: the standby never takes over a live leader
        assert len(running) == 1
        first = running[0]
        other = "r2" if first == "r1" else "r1"
        stops[first].set()
        await asyncio.wait_for(tasks[first], 10)
        while running != [other]:
            assert time.monotonic() < deadline + 10, running
            await asyncio.sleep(0.02)
        stops[other].set()
        await asyncio.wait_for(tasks[other], 10)

    asyncio.run(main())
    assert running == []
