"""The next step's batch drawn on a thread while the device computes this step's.

On a GPU the step waits for nothing the host does but the batch: drawn in the step, as the
synthetic chain's 2,048-token samples are (a Python loop over positions), it left the device idle
for a seventh of a 1B model's step on an H200. Every stream's batch is a pure function of
``(seed, replica, step)`` (``training.data.streams``), so drawing step + 1 ahead changes no batch; a
step asked out of turn (a resume, a catch-up) is drawn at once. One draw runs at a time, so a
user's dataset is never read from two threads at once."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from training.data.streams import BatchStream


class Prefetched:
    def __init__(self, stream: BatchStream) -> None:
        self.stream = stream
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cpn-data")
        self._ahead: tuple[int, int, Future[tuple[Any, Any]]] | None = None

    def batch(self, step: int, batch_size: int) -> tuple[Any, Any]:
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[:2] == (step, batch_size):
            got = ahead[2].result()
        else:
            if ahead is not None and not ahead[2].cancel():  # out of turn: the draw under way ends first
                ahead[2].exception()
            got = self.stream.batch(step, batch_size)
        self._ahead = (step + 1, batch_size, self._pool.submit(self.stream.batch, step + 1, batch_size))
        return got

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._ahead = None
