"""Bus over Redis, for control planes with several replicas: pub/sub fan-out, TTL keys, locks.

The sync client (thread-safe connection pool) serves publish, keys and locks; each subscription
opens its own ``redis.asyncio`` connection on the subscriber's event loop. Every key and channel
is prefixed so several deployments (or test runs) can share one Redis.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence

import redis
import redis.asyncio as aioredis
from redis.exceptions import LockError

from orchestration.bus.base import Message, decode, encode, validate_channel

_GLOB_CHARS = set("*?[]\\")


class RedisBus:
    def __init__(self, url: str, prefix: str = "cpn:") -> None:
        if _GLOB_CHARS & set(prefix):
            raise ValueError(f"redis prefix {prefix!r} must not contain glob characters")
        self.url = url
        self.prefix = prefix
        # Every connection carries the deployment's prefix as its name, so ``CLIENT LIST`` tells
        # whose connections a shared Redis holds.
        self.client_name = prefix.rstrip(":").replace(" ", "_") or "cpn"
        self._client = redis.Redis.from_url(url, decode_responses=True, client_name=self.client_name)

    def ping(self) -> bool:
        return bool(self._client.ping())

    def publish(self, channel: str, message: Message) -> None:
        validate_channel(channel)
        self._client.publish(self.prefix + channel, encode(message))

    def publish_many(self, messages: Sequence[tuple[str, Message]]) -> None:
        for channel, _ in messages:
            validate_channel(channel)
        pipe = self._client.pipeline(transaction=False)
        for channel, message in messages:
            pipe.publish(self.prefix + channel, encode(message))
        pipe.execute()

    @contextlib.asynccontextmanager
    async def subscribe(self, *channels: str) -> AsyncIterator[AsyncIterator[tuple[str, Message]]]:
        if not channels:
            raise ValueError("subscribe needs at least one channel")
        for c in channels:
            validate_channel(c)
        plain = [self.prefix + c for c in channels if "*" not in c]
        patterns = [self.prefix + c for c in channels if "*" in c]
        client = aioredis.Redis.from_url(self.url, decode_responses=True, client_name=self.client_name)
        pubsub = client.pubsub()
        try:
            if plain:
                await pubsub.subscribe(*plain)
            if patterns:
                await pubsub.psubscribe(*patterns)
            # Wait for the server's confirmations: once entered, no later publish can be missed.
            pending = len(plain) + len(patterns)
            while pending:
                msg = await pubsub.get_message(timeout=5.0)
                if msg is None:
                    raise TimeoutError(f"redis did not confirm subscription to {channels}")
                if msg["type"] in ("subscribe", "psubscribe"):
                    pending -= 1
            yield self._messages(pubsub)
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()
            with contextlib.suppress(Exception):
                await client.aclose()

    async def _messages(self, pubsub: aioredis.client.PubSub) -> AsyncIterator[tuple[str, Message]]:
        cut = len(self.prefix)
        async for msg in pubsub.listen():
            if msg["type"] in ("message", "pmessage"):
                yield msg["channel"][cut:], decode(msg["data"])

    def touch(self, key: str, ttl_s: float) -> None:
        self._client.set(self.prefix + key, "1", px=max(1, int(ttl_s * 1000)))

    def touch_many(self, keys: Iterable[str], ttl_s: float) -> None:
        pipe = self._client.pipeline(transaction=False)
        ms = max(1, int(ttl_s * 1000))
        for key in keys:
            pipe.set(self.prefix + key, "1", px=ms)
        pipe.execute()

    def alive(self, key: str) -> bool:
        return bool(self._client.exists(self.prefix + key))

    def expired(self, keys: Iterable[str]) -> list[str]:
        keys = list(keys)
        if not keys:
            return []
        pipe = self._client.pipeline(transaction=False)
        for k in keys:
            pipe.exists(self.prefix + k)
        return [k for k, present in zip(keys, pipe.execute(), strict=True) if not present]

    @contextlib.contextmanager
    def lock(self, name: str, ttl_s: float) -> Iterator[bool]:
        lock = self._client.lock(self.prefix + "lock:" + name, timeout=ttl_s, blocking=False)
        acquired = bool(lock.acquire(blocking=False))
        try:
            yield acquired
        finally:
            if acquired:
                with contextlib.suppress(LockError):  # expired and possibly taken by another replica
                    lock.release()

    def delete_prefixed(self) -> int:
        """Remove every key under this bus's prefix (tests and teardown)."""
        keys = list(self._client.scan_iter(match=self.prefix + "*", count=500))
        return int(self._client.delete(*keys)) if keys else 0

    def close(self) -> None:
        self._client.close()
