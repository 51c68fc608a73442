"""Leader election with fencing tokens, on the control plane's database.

Every replica serves REST and gRPC; the singletons (reaper, placer) run only on the leader. A
leader holds the ``leader_leases`` row for its group under an ``epoch`` (the fencing token) and
bumps ``beat`` every ``lease_s / 5``. A standby watches the row; once it has seen the same
(epoch, beat) for ``lease_s`` of its own monotonic clock (no wall clocks compared across
machines), it takes over with a compare-and-set that also increments the epoch. A leader that
stops cleanly releases the row, so a standby takes over at its next look.

Fencing: the leader's singletons run under ``fenced(name, epoch)`` (a context variable, which
their asyncio tasks and ``asyncio.to_thread`` calls inherit); every transaction they begin on a
factory with ``install_fence`` first reads the row FOR SHARE and refuses to go on (``Deposed``)
unless the epoch is still theirs. A takeover's UPDATE waits for those row locks, so once it commits
no transaction of the deposed leader can commit a write: the ones in flight finished before it,
and every later one sees the new epoch. The singletons keep the process's one session factory and
context (and whatever listens to them); only the code running under the fence is checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from sqlalchemy import event, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from orchestration.db.models import LeaderLease

log = logging.getLogger(__name__)

SINGLETONS = "singletons"  # the group of the reaper and the placer


class Deposed(Exception):
    """This replica no longer leads: another took over (the fencing token moved on)."""


@dataclass(frozen=True)
class LeaseView:
    epoch: int
    beat: int
    holder: str


class Watch:
    """A standby's view of the lease: whether the leader has gone silent for ``lease_s``. Pure."""

    def __init__(self, lease_s: float) -> None:
        self.lease_s = lease_s
        self._seen: LeaseView | None = None
        self._since = 0.0

    def should_take_over(self, view: LeaseView | None, now: float) -> bool:
        if view is None or not view.holder:  # never held, or released
            return True
        if view != self._seen:
            self._seen, self._since = view, now
            return False
        return now - self._since >= self.lease_s


def read_lease(session: Session, name: str) -> LeaseView | None:
    row = session.get(LeaderLease, name)
    return None if row is None else LeaseView(row.epoch, row.beat, row.holder)


def _read(factory: sessionmaker[Session], name: str) -> LeaseView | None:
    with factory() as session:
        return read_lease(session, name)


def try_acquire(factory: sessionmaker[Session], name: str, holder: str, seen: LeaseView | None) -> int | None:
    """Become leader if the lease is still as ``seen``; returns the new epoch, or None if it moved."""
    with factory() as session, session.begin():
        if seen is None:
            session.add(LeaderLease(name=name, epoch=1, beat=0, holder=holder))
            try:
                session.flush()
            except IntegrityError:
                return None
            return 1
        taken = session.execute(
            update(LeaderLease)
            .where(
                LeaderLease.name == name,
                LeaderLease.epoch == seen.epoch,
                LeaderLease.beat == seen.beat,
                LeaderLease.holder == seen.holder,
            )
            .values(epoch=seen.epoch + 1, beat=0, holder=holder)
        )
        return seen.epoch + 1 if taken.rowcount == 1 else None


def renew(factory: sessionmaker[Session], name: str, holder: str, epoch: int) -> bool:
    """Bump the beat; False if this replica has been deposed."""
    with factory() as session, session.begin():
        done = session.execute(
            update(LeaderLease)
            .where(LeaderLease.name == name, LeaderLease.epoch == epoch, LeaderLease.holder == holder)
            .values(beat=LeaderLease.beat + 1)
        )
        return done.rowcount == 1


def release(factory: sessionmaker[Session], name: str, holder: str, epoch: int) -> None:
    """Step down: a standby takes over at its next look instead of waiting out the lease."""
    with factory() as session, session.begin():
        session.execute(
            update(LeaderLease)
            .where(LeaderLease.name == name, LeaderLease.epoch == epoch, LeaderLease.holder == holder)
            .values(holder="")
        )


_FENCE: ContextVar[tuple[str, int] | None] = ContextVar("cpn_leader_fence", default=None)


@contextlib.contextmanager
def fenced(name: str, epoch: int) -> Iterator[None]:
    """Run the block (and the tasks and threads it starts) as the leader of ``name`` at ``epoch``."""
    token = _FENCE.set((name, epoch))
    try:
        yield
    finally:
        _FENCE.reset(token)


def install_fence(factory: sessionmaker[Session]) -> None:
    """Check the fence at the start of every transaction of ``factory``'s sessions begun under
    ``fenced`` (idempotent; sessions outside a fence are untouched)."""
    if getattr(factory, "_cpn_fence_installed", False):
        return

    @event.listens_for(factory, "after_begin")
    def _check(_session: Session, _transaction: Any, connection: Any) -> None:
        fence = _FENCE.get()
        if fence is None:
            return
        name, epoch = fence
        current = connection.execute(
            select(LeaderLease.epoch).where(LeaderLease.name == name).with_for_update(read=True)
        ).scalar_one_or_none()
        if current != epoch:
            raise Deposed(f"leadership of {name!r} moved from epoch {epoch} to {current}")

    factory._cpn_fence_installed = True  # type: ignore[attr-defined]


Singletons = Callable[[asyncio.Event], Awaitable[None]]


async def lead_when_elected(
    factory: sessionmaker[Session],
    stop: asyncio.Event,
    run: Singletons,
    *,
    holder: str,
    lease_s: float,
    name: str = SINGLETONS,
    take_over_at_once: bool = False,
    on_change: Callable[[bool], None] | None = None,
) -> None:
    """Campaign until elected, then run ``run(deposed)`` under the fence while renewing the lease;
    on losing it, stop the singletons and campaign again. Returns once ``stop`` is set.

    ``take_over_at_once`` (the embedded SQLite database, which one process serves) skips waiting
    out a lease left by a previous run of this control plane.
    """
    install_fence(factory)
    tick = lease_s / 5
    watch = Watch(lease_s)
    first = True
    while not stop.is_set():
        epoch: int | None = None
        try:
            view = await asyncio.to_thread(_read, factory, name)
            if (first and take_over_at_once) or watch.should_take_over(view, time.monotonic()):
                epoch = await asyncio.to_thread(try_acquire, factory, name, holder, view)
            first = False
        except Exception:
            log.exception("leader election: reading the lease failed")
        if epoch is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), tick)
            continue
        log.info("leader of %r (epoch %d): running the reaper and the placer", name, epoch)
        if on_change is not None:
            on_change(True)
        await _lead(factory, stop, run, holder=holder, name=name, epoch=epoch, lease_s=lease_s)
        if on_change is not None:
            on_change(False)
        watch = Watch(lease_s)


async def _lead(
    factory: sessionmaker[Session],
    stop: asyncio.Event,
    run: Singletons,
    *,
    holder: str,
    name: str,
    epoch: int,
    lease_s: float,
) -> None:
    deposed = asyncio.Event()
    with fenced(name, epoch):  # the task copies the context now: it, and only it, runs fenced
        singletons = asyncio.create_task(run(deposed))
    last_renewed = time.monotonic()
    try:
        while not stop.is_set() and not singletons.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), lease_s / 5)
            if stop.is_set():
                break
            try:
                if not await asyncio.to_thread(renew, factory, name, holder, epoch):
                    log.warning("deposed as leader of %r (epoch %d): stopping the singletons", name, epoch)
                    break
                last_renewed = time.monotonic()
            except Exception:
                log.exception("renewing the leader lease failed")
                if time.monotonic() - last_renewed >= lease_s:
                    log.warning("lease of %r not renewed for %.1fs: stepping down", name, lease_s)
                    break
    finally:
        deposed.set()
        try:
            await singletons
        except Exception:
            log.exception("the singletons failed; campaigning again")
        if stop.is_set():
            with contextlib.suppress(Exception):
                await asyncio.to_thread(release, factory, name, holder, epoch)
