"""Collectives as message patterns on the flow network.

Ring all-reduce (Patarasuk & Yuan 2009; NCCL's ring): n peers, the payload cut into n chunks;
2(n-1) steps (n-1 reduce-scatter, n-1 all-gather), in each of which every peer sends one chunk to
its successor. A peer sends step k+1 once its own step-k send has left and its predecessor's
step-k chunk has arrived, so each peer moves 2(n-1)/n of the payload and a slow link holds back
only the peers downstream of it. Ring all-gather is the same with n-1 steps of a whole payload.

Between sync participants every send is a gRPC call (``training.sync``: ``push`` and
``exchange`` are unary calls): the sender counts it done when the answer is back, one latency
after the last byte arrived, plus ``call_s``, the fixed seconds a call costs its two ends
(framing, authentication, thread hand-offs: an input, like the link figures). Inside a node
(NCCL/gloo) sends are not calls: ``call_s=None``.
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
        call_s: float | None = None,
    ) -> None:
        self.net, self.route, self.peers = net, route, list(peers)
        self.chunk, self.steps, self.on_done = chunk_bytes, steps, on_done
        self.call_s = call_s
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

        def answered() -> None:
            self.sent[i] += 1
            self._count_done(i)
            self._try_send(i)

        def arrived() -> None:
            self.received[j] += 1
            self._count_done(j)
            if self.call_s is None:
                self.sent[i] += 1
                self._count_done(i)
                self._try_send(i)
            else:
                self.net.at(self.route(self.peers[j], self.peers[i])[1] + self.call_s, answered)
            self._try_send(j)

        self.net.send(path, self.chunk, latency, arrived, label)

    def _count_done(self, i: int) -> None:
        """A peer is done when it has every chunk and its last send is answered."""
        if self.received[i] == self.steps and self.sent[i] == self.steps:
            self.finished += 1
            if self.finished == len(self.peers):
                self.on_done()


def all_reduce(
    net: Network,
    route: Route,
    peers: Sequence[object],
    nbytes: float,
    on_done: Callback,
    call_s: float | None = None,
) -> Ring:
    n = len(peers)
    return Ring(net, route, peers, nbytes / max(n, 1), 2 * (n - 1), on_done, call_s)


def all_gather(net: Network, route: Route, peers: Sequence[object], nbytes: float, on_done: Callback) -> Ring:
    """Every peer ends with every peer's ``nbytes`` payload."""
    return Ring(net, route, peers, nbytes, len(peers) - 1, on_done)


def exchange(
    net: Network,
    route: Route,
    edges: Sequence[tuple[object, object]],
    nbytes: float,
    on_done: Callback,
    call_s: float | None = None,
) -> None:
    """Every (src, dst) edge carries ``nbytes`` at once (pushes to peers, a gossip round); with
    ``call_s`` each is a call, done when its answer is back."""
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
        if call_s is None:
            net.send(path, nbytes, latency, one, label)
        else:
            back = route(dst, src)[1] + call_s
            net.send(path, nbytes, latency, lambda back=back: net.at(back, one), label)
