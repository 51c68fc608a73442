"""Pipeline schedules and one pipeline's run on the network.

GPipe (Huang et al. 2019): every micro-batch forward, then every backward. 1F1B (Narayanan et al.
2019, PipeDream-Flush; Megatron-LM's non-interleaved schedule): stage s of p runs min(p-s-1, m)
warm-up forwards, then alternates one forward and one backward, then drains the backwards. These
are the orders ``torch.distributed.pipelining``'s ScheduleGPipe and Schedule1F1B issue.

How a stage moves its tensors is also theirs (``_step_microbatches``, torch 2.4 to 2.14), not a
free-running isend per op:

- 1F1B, warm-up: receive the activation (wait), forward, wait for the previous forward's send,
  then send this one without waiting; the last warm-up forward's send is held back. Steady state,
  each pass behind one batch with one neighbour that it waits for in full: {send the held
  activation, receive the next gradient} before a backward, {send that gradient back, receive the
  next activation} before a forward. Cool-down: receive the gradient (wait), backward, wait for
  the previous backward's send, send this one. The stage waits for its last send at the end.
- GPipe: each forward waits for its activation and sends its output without waiting; all forward
  sends are waited for before the first backward; backwards likewise, waited for at the end.

So in steady state no stage computes while its tensors are on the wire, and a stage's port never
carries its activation and its gradient at once. A transfer is a rendezvous (gloo's TCP pair sends
an unbound buffer only once the receiver has posted its recv and said so, one latency back; NCCL's
send likewise waits for the receiver's buffer): its bytes leave at the later of the send being
posted and the recv's notice reaching the sender; the send completes when its last byte has left,
the recv one latency later. With tensor parallelism each tp rank sends its copy to the same tp
rank of the next stage, and a stage's batch completes when all its tp ranks' transfers have.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field

from benchmarks.sim.collectives import Route
from benchmarks.sim.network import Network

Op = tuple[str, int]  # ("F" | "B", micro-batch)


def stage_ops(schedule: str, pp: int, stage: int, m: int) -> list[Op]:
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    if schedule != "1f1b":
        raise ValueError(f"unknown pipeline schedule {schedule!r}")
    warm = min(pp - stage - 1, m)
    ops: list[Op] = [("F", i) for i in range(warm)]
    for i in range(m - warm):
        ops += [("F", warm + i), ("B", i)]
    return ops + [("B", i) for i in range(m - warm, m)]


@dataclass
class StageTimes:
    fwd: float  # seconds per micro-batch: compute plus tensor-parallel all-reduces
    bwd: float
    fwd_compute: float = 0.0
    bwd_compute: float = 0.0


class _Work:
    """A stage's batch of transfers (``dist.Work`` per tp rank): done when each of them is."""

    def __init__(self, parts: int) -> None:
        self.left = parts
        self.waiter: Callable[[], None] | None = None

    def one(self) -> None:
        self.left -= 1
        if self.left == 0 and self.waiter is not None:
            waiter, self.waiter = self.waiter, None
            waiter()


# What a stage's program asks for next: an op to compute, or batches to wait for.
Step = tuple[str, object]
Program = Generator[Step, None, None]


@dataclass
class Pipeline:
    """One replica: ``devices[s][t]`` is tp rank t of stage s. ``on_stage_done(s)`` after its last op."""

    net: Network
    route: Route
    devices: Sequence[Sequence[object]]
    times: Sequence[StageTimes]
    schedule: str
    m: int
    activation_bytes: float
    on_stage_done: Callable[[int], None]
    free_links: bool = False  # stage-to-stage transfers take no time (to measure the bare bubble)
    done_at: list[float] = field(default_factory=list)
    busy: list[float] = field(default_factory=list)

    def start(self) -> None:
        if self.schedule not in ("1f1b", "gpipe"):
            raise ValueError(f"unknown pipeline schedule {self.schedule!r}")
        pp = len(self.devices)
        self.done_at = [0.0] * pp
        self.busy = [0.0] * pp
        self._ops_left = [2 * self.m] * pp
        # per message (src, dst, kind, micro-batch): the send posted / the recv's notice arrived
        self._ready: dict[tuple[object, object, str, int], Callable[[], None]] = {}
        self._programs = [self._program(s) for s in range(pp)]
        for s in range(pp):
            self._advance(s)

    # ------------------------------------------------------------ the stage programs

    def _program(self, s: int) -> Program:
        if self.schedule == "gpipe":
            return self._gpipe(s)
        return self._one_f_one_b(s)

    def _gpipe(self, s: int) -> Program:
        sends: list[_Work] = []
        for i in range(self.m):
            yield "wait", [self._recv(s, "F", i)]
            yield "op", ("F", i)
            sends.append(self._send(s, "F", i))
        yield "wait", sends
        sends = []
        for i in range(self.m):
            yield "wait", [self._recv(s, "B", i)]
            yield "op", ("B", i)
            sends.append(self._send(s, "B", i))
        yield "wait", sends

    def _one_f_one_b(self, s: int) -> Program:
        pp, m = len(self.devices), self.m
        warm = min(m, pp - s)  # the steady state's first forward counted in (torch's count)
        f = b = 0
        sending: list[_Work] = []
        held: int | None = None  # a forward whose send waits for the next batch
        for _ in range(warm):
            yield "wait", [self._recv(s, "F", f)]
            yield "op", ("F", f)
            yield "wait", sending
            sending = []
            if f < warm - 1:
                sending = [self._send(s, "F", f)]
            else:
                held = f
            f += 1
        while True:
            batch = [self._send(s, "F", held)] if held is not None else []
            yield "wait", [*batch, self._recv(s, "B", b)]
            yield "op", ("B", b)
            b += 1
            if f == m:
                break
            yield "wait", [self._send(s, "B", b - 1), self._recv(s, "F", f)]
            yield "op", ("F", f)
            held, f = f, f + 1
        sending = [self._send(s, "B", b - 1)]
        while b < m:
            yield "wait", [self._recv(s, "B", b)]
            yield "op", ("B", b)
            yield "wait", sending
            sending = [self._send(s, "B", b)]
            b += 1
        yield "wait", sending

    def _advance(self, s: int) -> None:
        """Run stage s's program until it computes or waits for a transfer."""
        while True:
            step = next(self._programs[s], None)
            if step is None:
                return
            what, arg = step
            if what == "op":
                kind, i = arg  # type: ignore[misc]
                dur = self.times[s].fwd if kind == "F" else self.times[s].bwd
                self.busy[s] += dur
                self.net.at(dur, lambda: self._finish(s))
                return
            pending = [w for w in arg if w.left]  # type: ignore[attr-defined]
            if pending:
                self._wait(s, pending)
                return

    def _wait(self, s: int, pending: list[_Work]) -> None:
        """Go on with stage s once every one of ``pending`` has completed."""
        left = [len(pending)]

        def one() -> None:
            left[0] -= 1
            if left[0] == 0:
                self._advance(s)

        for w in pending:
            w.waiter = one

    def _finish(self, s: int) -> None:
        self._ops_left[s] -= 1
        if self._ops_left[s] == 0:
            self.done_at[s] = self.net.now
            self.on_stage_done(s)
        self._advance(s)

    # ------------------------------------------------------------ point-to-point transfers

    def _peer(self, s: int, kind: str, sending: bool) -> int | None:
        """The stage s sends a forward's output to (or receives a forward's input from)."""
        forward_peer = s + 1 if sending else s - 1
        t = forward_peer if kind == "F" else 2 * s - forward_peer
        return t if 0 <= t < len(self.devices) else None

    def _send(self, s: int, kind: str, i: int) -> _Work:
        t = self._peer(s, kind, True)
        if t is None:
            return _Work(0)
        work = _Work(len(self.devices[s]))
        for src, dst in zip(self.devices[s], self.devices[t], strict=True):
            self._meet((src, dst, kind, i), work.one, None)
        return work

    def _recv(self, s: int, kind: str, i: int) -> _Work:
        t = self._peer(s, kind, False)
        if t is None:
            return _Work(0)
        work = _Work(len(self.devices[s]))
        for src, dst in zip(self.devices[t], self.devices[s], strict=True):
            self._meet((src, dst, kind, i), None, work.one)
        return work

    def _meet(self, key: tuple, sent: Callable[[], None] | None, arrived: Callable[[], None] | None) -> None:
        """Post one side of a message; the bytes leave once the send is posted and the recv's
        notice has reached the sender."""
        src, dst = key[0], key[1]
        if arrived is not None:  # the recv: its notice travels back to the sender
            notice = 0.0 if self.free_links else self.route(dst, src)[1]
            self.net.at(notice, lambda: self._half(key, None, arrived))
        else:
            self._half(key, sent, None)

    def _half(self, key: tuple, sent: Callable[[], None] | None, arrived: Callable[[], None] | None) -> None:
        other = self._ready.pop(key, None)
        if other is None:
            self._ready[key] = sent or arrived  # type: ignore[assignment]
            return
        on_sent, on_arrived = (sent, other) if sent is not None else (other, arrived)
        self._transfer(key[0], key[1], on_sent, on_arrived)  # type: ignore[arg-type]

    def _transfer(
        self, src: object, dst: object, sent: Callable[[], None], arrived: Callable[[], None]
    ) -> None:
        if self.free_links:
            self.net.at(0.0, sent)
            self.net.at(0.0, arrived)
            return
        path, latency, label = self.route(src, dst)

        def left() -> None:
            sent()
            self.net.at(latency, arrived)

        self.net.send(path, self.activation_bytes, 0.0, left, label)
