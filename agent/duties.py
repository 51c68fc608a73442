"""Periodic duties: each runs on its own interval until the agent stops; a failing duty logs and
carries on rather than taking the daemon down."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


@dataclass
class Duty:
    name: str
    interval_s: Callable[[], float]  # read before every wait: the server may change the heartbeat rate
    fn: Callable[[], Awaitable[None] | None]
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    def poke(self) -> None:
        """Run now instead of at the end of the current interval."""
        self.wake.set()


async def run_duty(duty: Duty, stop: asyncio.Event) -> None:
    while not stop.is_set():
        duty.wake.clear()
        try:
            result = duty.fn()
            if inspect.isawaitable(result):
                await result
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("duty %s failed", duty.name)
        waiters = {asyncio.ensure_future(stop.wait()), asyncio.ensure_future(duty.wake.wait())}
        try:
            await asyncio.wait(
                waiters, timeout=max(0.01, duty.interval_s()), return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for waiter in waiters:
                waiter.cancel()
