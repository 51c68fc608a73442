"""Messages waiting to go up the stream, kept across reconnects.

Control messages (status, heartbeat, inventory) are never dropped and always go first; bulk
messages (metrics, logs) are bounded and the oldest are dropped while the server is unreachable.
A task's status never overtakes its own queued metrics: they move ahead of it into the control
lane, so a task that finished while the control plane was away reports its last steps, then how
it ended, and the job is never settled on metrics that are still on their way.
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
        kind = message.WhichOneof("kind")
        if kind in BULK_KINDS:
            self._bulk.append(message)
        else:
            if kind == "task_status":
                self._metrics_first(message.task_status.assignment_id)
            self._control.append(message)
        self._ready.set()

    def _metrics_first(self, assignment_id: str) -> None:
        """Move the task's queued metrics, in order, to the end of the control lane."""
        ahead: list[agent_pb2.AgentMessage] = []
        kept: list[agent_pb2.AgentMessage] = []
        for m in self._bulk:
            mine = m.WhichOneof("kind") == "metrics" and m.metrics.assignment_id == assignment_id
            (ahead if mine else kept).append(m)
        if ahead:
            self._bulk.clear()
            self._bulk.extend(kept)
            self._control.extend(ahead)

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
