"""Bus for one control-plane process: queues on the subscriber's loop, TTLs on a monotonic clock."""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import threading
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from orchestration.bus.base import Message, decode, encode, validate_channel


@dataclass(eq=False)
class _Subscriber:
    channels: frozenset[str]
    patterns: tuple[str, ...]
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[tuple[str, Message]] = field(default_factory=asyncio.Queue)

    def wants(self, channel: str) -> bool:
        return channel in self.channels or any(fnmatch.fnmatchcase(channel, p) for p in self.patterns)


class InProcessBus:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subscribers: list[_Subscriber] = []
        self._expiry: dict[str, float] = {}  # liveness key -> monotonic deadline
        self._locks: dict[str, float] = {}  # lock name -> monotonic deadline

    def publish(self, channel: str, message: Message) -> None:
        validate_channel(channel)
        payload = encode(message)  # each subscriber gets its own copy, as over Redis
        with self._lock:
            targets = [s for s in self._subscribers if s.wants(channel)]
        for sub in targets:
            with contextlib.suppress(RuntimeError):  # the subscriber's loop has closed
                sub.loop.call_soon_threadsafe(sub.queue.put_nowait, (channel, decode(payload)))

    def publish_many(self, messages: Sequence[tuple[str, Message]]) -> None:
        for channel, message in messages:
            self.publish(channel, message)

    @contextlib.asynccontextmanager
    async def subscribe(self, *channels: str) -> AsyncIterator[AsyncIterator[tuple[str, Message]]]:
        if not channels:
            raise ValueError("subscribe needs at least one channel")
        for c in channels:
            validate_channel(c)
        sub = _Subscriber(
            channels=frozenset(c for c in channels if "*" not in c),
            patterns=tuple(c for c in channels if "*" in c),
            loop=asyncio.get_running_loop(),
        )
        with self._lock:
            self._subscribers.append(sub)
        try:
            yield _drain(sub.queue)
        finally:
            with self._lock:
                self._subscribers.remove(sub)

    def touch(self, key: str, ttl_s: float) -> None:
        with self._lock:
            self._expiry[key] = time.monotonic() + ttl_s

    def touch_many(self, keys: Iterable[str], ttl_s: float) -> None:
        until = time.monotonic() + ttl_s
        with self._lock:
            for key in keys:
                self._expiry[key] = until

    def alive(self, key: str) -> bool:
        with self._lock:
            return self._expiry.get(key, 0.0) > time.monotonic()

    def expired(self, keys: Iterable[str]) -> list[str]:
        now = time.monotonic()
        with self._lock:
            return [k for k in keys if self._expiry.get(k, 0.0) <= now]

    @contextlib.contextmanager
    def lock(self, name: str, ttl_s: float) -> Iterator[bool]:
        with self._lock:
            now = time.monotonic()
            acquired = self._locks.get(name, 0.0) <= now
            if acquired:
                deadline = now + ttl_s
                self._locks[name] = deadline
        try:
            yield acquired
        finally:
            if acquired:
                with self._lock:
                    # only release what is still ours (the TTL may have passed and another taken it)
                    if self._locks.get(name) == deadline:
                        del self._locks[name]

    def close(self) -> None:
        with self._lock:
            self._subscribers.clear()
            self._expiry.clear()
            self._locks.clear()


async def _drain(queue: asyncio.Queue[tuple[str, Message]]) -> AsyncIterator[tuple[str, Message]]:
    while True:
        yield await queue.get()
