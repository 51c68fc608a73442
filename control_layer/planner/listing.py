"""Orders that do not depend on how a fleet lists its members: a snapshot may list its regions,
clusters and nodes in any order, and a quote must not change with it. Pure."""

from __future__ import annotations

import functools
import re


@functools.lru_cache(maxsize=1 << 17)
def natural(node_id: str) -> tuple:
    """An id's sort key with its numbers compared as numbers (n2 before n10): a listing-free order
    that keeps generated fleets' nodes where their names put them. Kept per id: quotes sort the
    same fleet's nodes again and again."""
    return tuple((0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", node_id) if t)
