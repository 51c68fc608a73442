"""Keeping the cyclic garbage collector off the long-lived fleet.

A 1,000-cluster snapshot (and the pools and memos derived from it) is ~200,000 tracked objects
that live until the next full reload. Every full (generation-2) collection walks all of them,
113-246 ms each, and lands inside whichever quote happens to trigger it. Freezing what is alive
once the fleet is loaded moves it out of the collector's walks; quotes' own garbage is still
collected as before.
"""

from __future__ import annotations

import gc


def settle_long_lived() -> None:
    """Collect what is garbage now, then freeze the rest until the next call.

    Call it after loading the fleet in full (rare: at start-up and every few minutes). Unfreezing
    first lets a replaced snapshot's cycles be collected; objects freed by reference counting
    (nearly all of them) are freed whether frozen or not.
    """
    gc.unfreeze()
    gc.collect()
    gc.freeze()
