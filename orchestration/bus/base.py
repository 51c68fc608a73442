"""The bus: pub/sub fan-out, liveness TTL keys and named locks, behind one interface with two backends.

Messages are JSON objects. A channel name containing ``*`` subscribes to every matching channel
(glob syntax), e.g. ``job.*``. ``publish`` is synchronous and thread-safe so domain code running in
worker threads can call it; ``subscribe`` is asynchronous and lives on the event loop.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any, Protocol, runtime_checkable

Message = dict[str, Any]


@runtime_checkable
class Bus(Protocol):
    def publish(self, channel: str, message: Message) -> None:
        """Deliver ``message`` to every current subscriber of ``channel`` (fire and forget)."""

    def publish_many(self, messages: Sequence[tuple[str, Message]]) -> None:
        """Publish each (channel, message) in order, in one round trip where the backend can."""
        ...

    def subscribe(self, *channels: str) -> AbstractAsyncContextManager[AsyncIterator[tuple[str, Message]]]:
        """Subscribe; the subscription is live when the context is entered. Yields (channel, message)."""

    def touch(self, key: str, ttl_s: float) -> None:
        """Mark ``key`` alive for ``ttl_s`` seconds from now."""

    def touch_many(self, keys: Iterable[str], ttl_s: float) -> None:
        """``touch`` each key, in one round trip where the backend has them."""

    def alive(self, key: str) -> bool:
        """Whether ``key`` was touched and its TTL has not run out."""

    def expired(self, keys: Iterable[str]) -> list[str]:
        """The subset of ``keys`` that are not alive (expired or never touched), in input order."""

    def lock(self, name: str, ttl_s: float) -> AbstractContextManager[bool]:
        """Try once to take the named lock for at most ``ttl_s``; yields whether it was acquired."""

    def close(self) -> None:
        """Release connections; the bus is unusable afterwards."""


def encode(message: Message) -> str:
    """Serialize a message, refusing anything that is not a JSON object (same rule on both backends)."""
    if not isinstance(message, dict):
        raise TypeError(f"bus messages must be dicts, got {type(message).__name__}")
    return json.dumps(message, separators=(",", ":"), default=_json_default)


def decode(data: str | bytes) -> Message:
    return json.loads(data)


def _json_default(value: Any) -> Any:
    # datetimes are the one non-JSON type domain code routinely puts in event payloads
    isoformat = getattr(value, "isoformat", None)
    if callable(isoformat):
        return isoformat()
    raise TypeError(f"bus message value of type {type(value).__name__} is not JSON serializable")


def validate_channel(channel: str) -> str:
    if not channel or any(c.isspace() for c in channel):
        raise ValueError(f"invalid bus channel name {channel!r}")
    return channel
