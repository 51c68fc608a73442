"""How busy each link between regions is now, in bytes/s (pure: samples in, rates out).

A task's leader reports its cumulative WAN bytes sent with every metrics line (``TaskMetric.
wan_bytes_sent``). Its rate over the recent window is what it added over that span. The worker
counts one total over all its peers, so a task's rate is split evenly over the links its job's
sync sends on out of its region (``sync_edges``): right for a ring or a pair, where a leader
sends to one peer; an even share for gossip and a parameter server.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from service_layer.dashboard.sync_edges import Edge


@dataclass(frozen=True)
class Sample:
    task_id: str
    at_s: float  # seconds on any common clock
    bytes_sent: float  # cumulative since the task started


@dataclass(frozen=True)
class Sender:
    task_id: str
    job_id: str
    region: str


def task_rates(samples: Iterable[Sample]) -> dict[str, float]:
    """Bytes/s per task over its samples: the sum of the counter's rises over the span they cover
    (a fall is a restarted worker, whose counter began again). Tasks with fewer than two samples,
    or none apart in time, have no rate."""
    by_task: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        by_task[s.task_id].append(s)
    out: dict[str, float] = {}
    for task_id, rows in by_task.items():
        rows.sort(key=lambda s: s.at_s)
        span = rows[-1].at_s - rows[0].at_s
        if len(rows) < 2 or span <= 0:
            continue
        sent = sum(max(0.0, b.bytes_sent - a.bytes_sent) for a, b in zip(rows, rows[1:], strict=False))
        out[task_id] = sent / span
    return out


def link_use(
    senders: Sequence[Sender], rates: Mapping[str, float], edges: Mapping[str, Sequence[Edge]]
) -> dict[Edge, float]:
    """Bytes/s on each directed region pair: every sending task's rate over its job's links out of
    its region, in equal shares. A task whose job sends nothing out of its region adds nothing."""
    out: dict[Edge, float] = defaultdict(float)
    for s in senders:
        rate = rates.get(s.task_id)
        if not rate:
            continue
        outs = [e for e in edges.get(s.job_id, ()) if e[0] == s.region]
        for e in outs:
            out[e] += rate / len(outs)
    return dict(out)
