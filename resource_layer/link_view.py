"""The links the planner and the API see: measured where a fresh measurement exists, else declared.

Pure: takes the declared rows and the measurements as plain data, returns plain data. One
function serves the planner's snapshot and ``GET /v1/links``, so both always agree.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

# A link's measured figures are the median of its newest fresh probes: one probe that met a
# passing burst of other traffic does not move the planner.
MEDIAN_OF = 5


@dataclass(frozen=True)
class DeclaredLink:
    src: str
    dst: str
    bandwidth_gbps: float
    latency_ms: float
    egress_price_per_gb: float
    declared_at: datetime
    private: bool = False


@dataclass(frozen=True)
class Measurement:
    src: str
    dst: str
    bandwidth_gbps: float
    rtt_ms: float
    measured_at: datetime
    src_node_id: str
    dst_node_id: str
    bulk_bytes: int


@dataclass(frozen=True)
class EffectiveLink:
    src: str
    dst: str
    bandwidth_gbps: float
    latency_ms: float  # one way: half the measured round trip
    egress_price_per_gb: float
    private: bool  # declared so (no probe can tell): where torchrun groups' traffic may go
    source: str  # "measured" | "declared"
    as_of: datetime  # when it was measured or declared
    basis: str  # from what, in words
    samples: int  # measurements the figures are the median of (0 when declared)


def _egress(declared: dict[tuple[str, str], DeclaredLink], src: str, dst: str) -> float:
    """Egress is a price, not something a probe can see: the declared link's (either direction)."""
    d = declared.get((src, dst)) or declared.get((dst, src))
    return d.egress_price_per_gb if d is not None else 0.0


def declared_private(private: Mapping[tuple[str, str], bool], src: str, dst: str) -> bool:
    """Private only where declared so (``private``: (src, dst) -> the declared link's flag), in
    every direction declared (one serves both unless both are): groups' traffic runs both ways."""
    given = [private[k] for k in ((src, dst), (dst, src)) if k in private]
    return bool(given) and all(given)


def effective_links(
    declared: Sequence[DeclaredLink],
    measurements: Sequence[Measurement],
    now: datetime,
    fresh_s: float,
) -> list[EffectiveLink]:
    by_pair = {(d.src, d.dst): d for d in declared}
    flags = {pair: d.private for pair, d in by_pair.items()}
    fresh: dict[tuple[str, str], list[Measurement]] = defaultdict(list)
    for m in measurements:
        if m.measured_at >= now - timedelta(seconds=fresh_s) and m.bandwidth_gbps > 0:
            fresh[(m.src, m.dst)].append(m)
    out: dict[tuple[str, str], EffectiveLink] = {}
    for (src, dst), ms in fresh.items():
        newest = sorted(ms, key=lambda m: m.measured_at, reverse=True)[:MEDIAN_OF]
        last = newest[0]
        out[(src, dst)] = EffectiveLink(
            src=src,
            dst=dst,
            bandwidth_gbps=statistics.median(m.bandwidth_gbps for m in newest),
            latency_ms=statistics.median(m.rtt_ms for m in newest) / 2,
            egress_price_per_gb=_egress(by_pair, src, dst),
            private=declared_private(flags, src, dst),
            source="measured",
            as_of=last.measured_at,
            basis=(
                f"median of {len(newest)} probe(s); newest: node {last.src_node_id} -> node "
                f"{last.dst_node_id}, {last.bulk_bytes} bytes timed, rtt {last.rtt_ms:.2f} ms"
            ),
            samples=len(newest),
        )
    for pair, d in by_pair.items():
        if pair in out:
            continue
        out[pair] = EffectiveLink(
            src=d.src,
            dst=d.dst,
            bandwidth_gbps=d.bandwidth_gbps,
            latency_ms=d.latency_ms,
            egress_price_per_gb=d.egress_price_per_gb,
            private=declared_private(flags, d.src, d.dst),
            source="declared",
            as_of=d.declared_at,
            basis="declared by an admin (PUT /v1/links); no fresh measurement",
            samples=0,
        )
    return [out[k] for k in sorted(out)]
