"""Node liveness on the bus: the key each heartbeat touches with a TTL of interval x misses."""

from __future__ import annotations


def node_alive_key(node_id: str) -> str:
    """The bus key the resource layer touches on each heartbeat and the reaper checks."""
    return f"node.{node_id}.alive"
