"""Pipeline schedules and one pipeline's run on the network.

GPipe (Huang et al. 2019): every micro-batch forward, then every backward. 1F1B (Narayanan et al.
2019, PipeDream-Flush; Megatron-LM's non-interleaved schedule): stage s of p runs min(p-s-1, m)
warm-up forwards, then alternates one forward and one backward, then drains the backwards. These
are the orders ``torch.distributed.pipelining``'s ScheduleGPipe and Schedule1F1B issue.

A stage runs its ops one at a time in that order. A forward of micro-batch i on stage s waits for
its activation from stage s-1; a backward waits for the gradient from stage s+1. Sends are
asynchronous (isend): a stage goes on computing while its output is on the wire. Messages from one
rank to another go in order, one after the other: gloo carries a pair of ranks over one TCP
stream, and NCCL runs a communicator's point-to-point operations in order on its stream, so a
second activation waits for the first one's last byte rather than sharing the wire with it. With tensor
parallelism each tp rank sends its copy to the same tp rank of the next stage, and an op starts
when all its tp ranks' inputs have arrived.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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
        pp = len(self.devices)
        self.ops = [stage_ops(self.schedule, pp, s, self.m) for s in range(pp)]
        self.next_op = [0] * pp
        self.running = [False] * pp
        # inputs still missing per (stage, op): tp copies not yet arrived
        self.waiting: dict[tuple[int, str, int], int] = {}
        for s in range(pp):
            for i in range(self.m):
                if s > 0:
                    self.waiting[(s, "F", i)] = len(self.devices[s])
                if s < pp - 1:
                    self.waiting[(s, "B", i)] = len(self.devices[s])
        self.done_at = [0.0] * pp
        self.busy = [0.0] * pp
        self._pairs: dict[tuple[object, object], list[Callable[[], None]]] = {}
        for s in range(pp):
            self._try(s)

    def _try(self, s: int) -> None:
        if self.running[s] or self.next_op[s] >= len(self.ops[s]):
            return
        kind, i = self.ops[s][self.next_op[s]]
        if self.waiting.get((s, kind, i), 0) > 0:
            return
        self.running[s] = True
        dur = self.times[s].fwd if kind == "F" else self.times[s].bwd
        self.busy[s] += dur
        self.net.at(dur, lambda: self._finish(s, kind, i))

    def _finish(self, s: int, kind: str, i: int) -> None:
        self.running[s] = False
        self.next_op[s] += 1
        target = s + 1 if kind == "F" else s - 1
        if 0 <= target < len(self.devices):
            for src, dst in zip(self.devices[s], self.devices[target], strict=True):
                self._send(src, dst, (target, kind, i))
        if self.next_op[s] == len(self.ops[s]):
            self.done_at[s] = self.net.now
            self.on_stage_done(s)
        self._try(s)

    def _send(self, src: object, dst: object, key: tuple[int, str, int]) -> None:
        def arrived() -> None:
            self.waiting[key] -= 1
            self._try(key[0])

        if self.free_links:
            self.net.at(0.0, arrived)
            return
        queue = self._pairs.setdefault((src, dst), [])
        queue.append(arrived)
        if len(queue) == 1:
            self._next_on_pair(src, dst)

    def _next_on_pair(self, src: object, dst: object) -> None:
        """Start the oldest message waiting between src and dst; when its last byte has left,
        deliver it one latency later and start the next."""
        queue = self._pairs[(src, dst)]
        path, latency, label = self.route(src, dst)
        arrived = queue[0]

        def sent() -> None:
            self.net.at(latency, arrived)
            queue.pop(0)
            if queue:
                self._next_on_pair(src, dst)

        self.net.send(path, self.activation_bytes, 0.0, sent, label)
