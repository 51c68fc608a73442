"""``training.data.prefetch``: the next step's batch drawn ahead gives the very batches the stream
gives, in turn or out of it, and never reads the stream from two threads at once."""

from __future__ import annotations

import threading

import torch

from training.data.markov import MarkovSource
from training.data.prefetch import Prefetched
from training.data.streams import MarkovStream


class Watched(MarkovStream):
    """The real stream, recording each draw and whether another was under way."""

    def __init__(self) -> None:
        super().__init__(MarkovSource(64, seed=1), seq_len=16, seed=5, replica=0)
        self.calls: list[tuple[int, int]] = []
        self.overlapped = False
        self._busy = threading.Lock()

    def batch(self, step: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not self._busy.acquire(blocking=False):
            self.overlapped = True
            self._busy.acquire()
        try:
            self.calls.append((step, batch_size))
            return super().batch(step, batch_size)
        finally:
            self._busy.release()


def test_batches_in_turn_and_out_of_turn_are_the_streams_own() -> None:
    plain = MarkovStream(MarkovSource(64, seed=1), seq_len=16, seed=5, replica=0)
    watched = Watched()
    ahead = Prefetched(watched)
    try:
        asked = [(1, 4), (2, 4), (3, 4), (7, 4), (8, 4), (8, 2), (3, 4)]  # a resume, a new size, a rewind
        for step, size in asked:
            x, y = ahead.batch(step, size)
            px, py = plain.batch(step, size)
            assert torch.equal(x, px) and torch.equal(y, py), (step, size)
    finally:
        ahead.close()
    # A batch asked in turn was drawn once, ahead; one asked out of turn was drawn at once (step 3
    # twice: in turn, then after the rewind). A draw ahead that was not asked for next (4 and 9 at
    # size 4) was cancelled if it had not started, else drawn and dropped.
    assert watched.calls[0] == (1, 4) and watched.calls.count((2, 4)) == 1
    assert watched.calls.count((3, 4)) == 2 and watched.calls.count((8, 4)) == 1
    assert set(watched.calls) <= {*asked, *((step + 1, size) for step, size in asked)}
    assert not watched.overlapped
