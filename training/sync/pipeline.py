"""Pipelining a ring's hops: each hop's chunk travels as a few parts, one push each, and a part
goes on to the next hop as soon as it is in, so a region's link carries the next hop's first part
while the rest of the current hop still arrives (no gap between hops for the handling of a whole
chunk: arrival, decoding, the sum, encoding, and starting the next call).

The pushes to the ring's next region go out one after another (``PushQueue``): each starts as
soon as gRPC has taken the previous one's frames, so the parts arrive in order and the first is
in early, where concurrent calls would share the link and all arrive at the end.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future

from training.sync.algorithms.schedule import fragment_slices
from training.sync.messages import OutMessage
from training.sync.transport import PeerClient, PeerError

# Elements per part of a hop's chunk: 512 KiB in float32, about what a 100 Mbit/s link carries in
# 40 ms, well above what its window in flight needs and a few frames of the default chunk size;
# a smaller chunk is one part (each part costs a call).
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
    """Pushes to one peer in order, each started once the previous one's frames are taken."""

    def __init__(self, client: PeerClient, deadline: float) -> None:
        self.client, self.deadline = client, deadline
        self.acks: list[Future] = []
        self._q: queue.SimpleQueue[OutMessage | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"push-{client.dst}", daemon=True)
        self._thread.start()

    def put(self, msg: OutMessage) -> None:
        self._q.put(msg)

    def close(self) -> list[Future]:
        """Every push started (after the ones queued); their answers, in order."""
        self._q.put(None)
        self._thread.join()
        return self.acks

    def _run(self) -> None:
        while (msg := self._q.get()) is not None:
            timeout = max(0.1, self.deadline - time.monotonic())
            try:
                written, fut = self.client.push_started(msg, timeout)
            except PeerError as e:
                fut = Future()
                fut.set_exception(e)
                self.acks.append(fut)
                continue
            self.acks.append(fut)
            written.wait()
