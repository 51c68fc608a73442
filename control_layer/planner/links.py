"""Achieved bandwidth and latency of a snapshot's links and cluster fabrics, at the calibrated
goodput (``cost_model.link_goodput``)."""

from __future__ import annotations

import math

from control_layer.planner import cost_model as cm
from control_layer.planner.plan_types import Calibration
from control_layer.planner.snapshot import ClusterInfo, ResourceSnapshot


def intra_bytes_per_s(cluster: ClusterInfo, calibration: Calibration | None) -> float:
    """The cluster fabric's achieved bandwidth (calibrated under the key "region|region")."""
    goodput = cm.link_goodput(cluster.region, cluster.region, calibration)
    return cm.bytes_per_s(cluster.intra_bandwidth_gbps, goodput)


def port_bytes_per_s(cluster: ClusterInfo, gbps: float, calibration: Calibration | None) -> float:
    """A node-level figure of the cluster's fabric, at the fabric's achieved fraction."""
    return cm.bytes_per_s(gbps, cm.link_goodput(cluster.region, cluster.region, calibration))


class Links:
    """Goodput-adjusted link numbers between regions, from a snapshot and a calibration (memoised).

    Between two regions ``lat`` is what one hop of an exchange call pays: the link's one-way
    latency plus half the call's fixed cost (``cm.exchange_call_seconds``, per idle core, times
    ``call_share``, the host share of the leaders), so the 2 hops of every call
    (``cm.wan_latency_hops``) add its round trip and its fixed cost. ``link_lat`` is the latency alone.
    """

    def __init__(
        self, snapshot: ResourceSnapshot, calibration: Calibration | None, call_share: float = 1.0
    ) -> None:
        self.snapshot = snapshot
        self.calibration = calibration
        self.call_share = call_share
        self._memo: dict[tuple[str, str], tuple[float, float, float, float]] = {}

    def _get(self, a: str, b: str) -> tuple[float, float, float, float]:
        got = self._memo.get((a, b))
        if got is None:
            ln = self.snapshot.link(a, b)
            if ln is None:
                got = (0.0, math.inf, 0.0, 0.0)
            else:
                goodput = cm.link_goodput(a, b, self.calibration, measured=ln.source == "measured")
                bw = cm.bytes_per_s(ln.bandwidth_gbps, goodput)
                # Every hop of an exchange is a call, also between two clusters of one region.
                call = cm.exchange_call_seconds([a, b], self.calibration)
                got = (bw, ln.latency_ms / 1000.0, ln.egress_price_per_gb, call)
            self._memo[(a, b)] = got
        return got

    def bw(self, a: str, b: str) -> float:
        """Bytes/s achieved from a to b; 0 when no link is known."""
        return self._get(a, b)[0]

    def lat(self, a: str, b: str) -> float:
        """Seconds one hop of an exchange call from a to b pays (latency and half the call's cost)."""
        got = self._get(a, b)
        return got[1] + got[3] * self.call_share / 2.0

    def link_lat(self, a: str, b: str) -> float:
        return self._get(a, b)[1]

    def call_s(self, a: str, b: str) -> float:
        """Fixed seconds of one exchange call between a and b, per idle core."""
        return self._get(a, b)[3]

    def egress(self, a: str, b: str) -> float:
        return self._get(a, b)[2]
