"""The control plane's Prometheus metrics: one registry per server process, passed in its context.

Layers count what happens as it happens (heartbeats, placements, requests); what is a fact of the
database (jobs by state, nodes alive, the queue, estimate error) is read when Prometheus scrapes,
so a restarted replica reports the truth at once instead of counting from zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Request and placement latencies span sub-millisecond reads to multi-second plans.
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass
class ServerMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    collectors: list[object] = field(default_factory=list)  # scrape-time collectors registered on it

    def __post_init__(self) -> None:
        r = self.registry
        self.requests = Histogram(
            "cpn_http_request_duration_seconds",
            "REST request latency by method, route template and status code",
            ["method", "route", "status"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.heartbeats = Counter("cpn_heartbeats", "Agent heartbeats ingested", registry=r)
        self.submissions = Counter(
            "cpn_submissions",
            "Jobs stored by POST /v1/jobs, by the path that answered (short: service_layer/fast_submit.py)",
            ["path"],
            registry=r,
        )
        self.placements = Histogram(
            "cpn_placement_duration_seconds",
            "Time to plan and allocate one job placement, by outcome",
            ["outcome"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.leader = Gauge(
            "cpn_leader", "1 while this replica leads (runs the reaper and placer)", registry=r
        )
