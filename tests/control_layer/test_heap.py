"""Settling the heap: garbage present is collected, the rest leaves the collector's walks."""

from __future__ import annotations

import gc
import weakref

from control_layer.heap import settle_long_lived


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_settle_collects_cycles_then_freezes_what_lives() -> None:
    try:
        a, b = _Node(), _Node()
        a.other, b.other = b, a  # a cycle only the cyclic collector frees
        dead = weakref.ref(a)
        del a, b
        kept = [_Node() for _ in range(1000)]
        settle_long_lived()
        assert dead() is None
        frozen = gc.get_freeze_count()
        assert frozen >= len(kept)
        # a second call unfreezes first, so a cycle dropped since is collected too
        c, d = _Node(), _Node()
        c.other, d.other = d, c
        dead = weakref.ref(c)
        del c, d
        settle_long_lived()
        assert dead() is None
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
