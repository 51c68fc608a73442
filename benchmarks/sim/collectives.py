"""Collectives as message patterns on the flow network.

Ring all-reduce (Patarasuk & Yuan 2009; NCCL's ring): n peers, the payload cut into n chunks;
2(n-1) steps (n-1 reduce-scatter, n-1 all-gather), in each of which every peer sends one chunk to
its successor. A peer sends step k+1 once its own step-k send has left and its predecessor's
step-k chunk has arrived, so each peer moves 2(n-1)/n of the payload and a slow link holds back
only the peers downstream of it. Ring all-gather is the same with n-1 steps of a whole payload.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from benchmarks.sim.network import Callback, Network

# (source, destination) -> (resources on the path, latency in s, link label)
Route = Callable[[object, object], tuple[tuple[object, ...], float, str]]


class Ring:
    """One ring collective over ``peers`` (in ring order); ``on_done`` when every peer has all."""

    def __init__(
        self,
        net: Network,
        route: Route,
        peers: Sequence[object],
        chunk_bytes: float,
        steps: int,
        on_done: Callback,
    ) -> None:
        self.net, self.route, self.peers = net, route, list(peers)
        self.chunk, self.steps, self.on_done = chunk_bytes, steps, on_done
        n = len(self.peers)
        self.started = [0] * n  # sends begun
        self.sent = [0] * n  # sends delivered (one buffer per peer: the next waits for this one)
        self.received = [0] * n  # chunks arrived from the predecessor
        self.finished = 0

    def start(self) -> None:
        if len(self.peers) < 2 or self.steps == 0:
            self.net.at(0.0, self.on_done)
            return
        for i in range(len(self.peers)):
            self._try_send(i)

    def _try_send(self, i: int) -> None:
        k = self.started[i]
        if k >= self.steps or self.sent[i] < k or self.received[i] < k:
            return
        self.started[i] += 1
        j = (i + 1) % len(self.peers)
        path, latency, label = self.route(self.peers[i], self.peers[j])

        def arrived() -> None:
            self.sent[i] += 1
            self.received[j] += 1
            if self.received[j] == self.steps:
                self.finished += 1
                if self.finished == len(self.peers):
                    self.on_done()
            self._try_send(i)
            self._try_send(j)

        self.net.send(path, self.chunk, latency, arrived, label)


def all_reduce(net: Network, route: Route, peers: Sequence[object], nbytes: float, on_done: Callback) -> Ring:
    n = len(peers)
    return Ring(net, route, peers, nbytes / max(n, 1), 2 * (n - 1), on_done)


def all_gather(net: Network, route: Route, peers: Sequence[object], nbytes: float, on_done: Callback) -> Ring:
    """Every peer ends with every peer's ``nbytes`` payload."""
    return Ring(net, route, peers, nbytes, len(peers) - 1, on_done)


def exchange(
    net: Network, route: Route, edges: Sequence[tuple[object, object]], nbytes: float, on_done: Callback
) -> None:
    """One gossip round: every (src, dst) edge carries ``nbytes`` at once."""
    if not edges:
        net.at(0.0, on_done)
        return
    left = [len(edges)]

    def one() -> None:
        left[0] -= 1
        if left[0] == 0:
            on_done()

    for src, dst in edges:
        path, latency, label = route(src, dst)
        net.send(path, nbytes, latency, one, label)
