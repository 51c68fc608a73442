"""Pipelining a ring's hops: each hop's chunk travels as a few parts, a message each, and a part
goes on to the next hop as soon as it is in, so a region's link carries the next hop's first part
while the rest of the current hop still arrives (no gap between hops for the handling of a whole
chunk: arrival, decoding, the sum, encoding, and starting the next call).

The pushes to the ring's next region go out one after another on one call (``PushQueue``), so
the parts arrive in order and the first is in early, where concurrent calls would share the link
and all arrive at the end; one call also spares each part a stream and, on both ends, a thread
(gRPC's request thread, the server's handler) that would have to be started and scheduled on a
host busy training, while the link waits.
"""

from __future__ import annotations

import queue
import time
from concurrent.futures import Future

from training.sync.algorithms.schedule import fragment_slices
from training.sync.messages import OutMessage
from training.sync.transport import PeerClient, PeerError

# Elements per part of a hop's chunk: 512 KiB in float32, about what a 100 Mbit/s link carries in
# 40 ms, well above what its window in flight needs and a few frames of the default chunk size;
# a smaller chunk is one part (each part costs a message and a wake-up on both ends).
PART_ELEMS = 1 << 17
MAX_PARTS = 16


def part_slices(chunk: slice, numel_hint: int) -> list[slice]:
    """``chunk`` (a ring chunk of the flat payload) cut into the parts it travels as. Every region
    cuts it alike: the number of parts follows from ``numel_hint`` (the payload's size over the
    ring's), which every member knows."""
    n = max(1, min(MAX_PARTS, -(-numel_hint // PART_ELEMS)))
    at = chunk.start
    return [slice(at + s.start, at + s.stop) for s in fragment_slices(chunk.stop - chunk.start, n)]


class PushQueue:
    """Pushes to one peer in order, all on one ``PushSeries`` call: a part goes out as soon as it
    is put, behind the ones before it, with no call, stream or thread to start per part."""

    def __init__(self, client: PeerClient, deadline: float) -> None:
        self._q: queue.SimpleQueue[OutMessage | None] = queue.SimpleQueue()
        try:
            self.ack = client.push_series(self._q, max(0.1, deadline - time.monotonic()))
        except PeerError as e:
            self.ack = Future()
            self.ack.set_exception(e)

    def put(self, msg: OutMessage) -> None:
        self._q.put(msg)

    def close(self) -> list[Future]:
        """The series ends after the messages queued; its answer."""
        self._q.put(None)
        return [self.ack]
