"""Messages waiting to go up the stream, kept across reconnects.

Control messages (status, heartbeat, inventory) are never dropped and always go first; bulk
messages (metrics, logs) are bounded and the oldest are dropped while the server is unreachable.
"""

from __future__ import annotations

import asyncio
from collections import deque

from proto.cpn.agent.v1 import agent_pb2

BULK_KINDS = ("metrics", "log")


class Outbox:
    def __init__(self, bulk_limit: int = 10_000) -> None:
        self._control: deque[agent_pb2.AgentMessage] = deque()
        self._bulk: deque[agent_pb2.AgentMessage] = deque(maxlen=bulk_limit)
        self._ready = asyncio.Event()
        self._closed = False

    def put(self, message: agent_pb2.AgentMessage) -> None:
        bulk = message.WhichOneof("kind") in BULK_KINDS
        (self._bulk if bulk else self._control).append(message)
        self._ready.set()

    def requeue(self, message: agent_pb2.AgentMessage) -> None:
        """Put back a message taken for a stream that ended before it could be sent."""
        bulk = message.WhichOneof("kind") in BULK_KINDS
        (self._bulk if bulk else self._control).appendleft(message)
        self._ready.set()

    def drop_heartbeats(self) -> None:
        """Heartbeats queued for a stream that broke say nothing true about now."""
        kept = [m for m in self._control if m.WhichOneof("kind") != "heartbeat"]
        self._control.clear()
        self._control.extend(kept)

    def close(self) -> None:
        """Let ``get`` return None once everything queued has gone (the agent is stopping)."""
        self._closed = True
        self._ready.set()

    def __len__(self) -> int:
        return len(self._control) + len(self._bulk)

    async def get(self) -> agent_pb2.AgentMessage | None:
        while True:
            if self._control:
                return self._control.popleft()
            if self._bulk:
                return self._bulk.popleft()
            if self._closed:
                return None
            self._ready.clear()
            await self._ready.wait()
