"""The GIL's switch interval in a process whose exchanges overlap its training.

An overlapped round's threads (gRPC's request and polling threads, the servers' handlers, the
ring's) each take the GIL briefly many times a round: per frame sent and received. The training
thread beside them holds it between torch ops, and retakes it at once after a short op, so a
waiting thread gets it only when the interpreter forces a switch: after ``sys.getswitchinterval()``,
5 ms by default. Per frame that is up to 5 ms while the link may sit idle, a few hundred ms a
round. A shorter interval bounds each wait; it costs the training thread nothing while no other
thread waits (the interval only times a switch someone has asked for).
"""

from __future__ import annotations

import sys

# At most this long a waiting exchange thread waits for the training thread to drop the GIL.
OVERLAP_SWITCH_S = 0.0005


def favour_exchanges() -> float:
    """Shorten the switch interval to ``OVERLAP_SWITCH_S`` (never lengthen it); returns the
    interval before, for ``restore``."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(min(before, OVERLAP_SWITCH_S))
    return before


def restore(before: float) -> None:
    sys.setswitchinterval(before)
