"""Ring all-reduce schedule (reduce-scatter, then all-gather), as pure functions of a region's
position: each region sends 2(R-1)/R of the payload per exchange instead of (R-1) times all of it."""

from __future__ import annotations


def ring_members(order: list[str] | None, live: list[str]) -> list[str]:
    """The live regions in ring order (``order`` first, then any live region it does not name)."""
    alive = set(live)
    ring = [r for r in (order or []) if r in alive]
    return ring + sorted(alive - set(ring))


def reduce_scatter_step(i: int, k: int, size: int) -> tuple[int, int]:
    """(chunk sent, chunk received and added to) by position ``i`` at step ``k`` of R-1."""
    return (i - k) % size, (i - k - 1) % size


def owned_chunk(i: int, size: int) -> int:
    """The chunk position ``i`` holds fully reduced after the reduce-scatter."""
    return (i + 1) % size


def all_gather_step(i: int, k: int, size: int) -> tuple[int, int]:
    """(chunk forwarded, chunk received) by position ``i`` at step ``k`` of R-1."""
    return (i + 1 - k) % size, (i - k) % size
