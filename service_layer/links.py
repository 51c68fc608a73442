"""Declared links between regions (admin): the planner reads them for WAN bandwidth, egress price and
whether they are private (the only links a torchrun group's gloo/NCCL traffic may cross)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from contracts.errors import NotFound
from orchestration.db.base import utcnow
from orchestration.db.models import Link, Region


def upsert_link(
    session: Session,
    src: str,
    dst: str,
    bandwidth_gbps: float,
    latency_ms: float,
    egress_price_per_gb: float,
    private: bool = False,
) -> Link:
    """Create or replace the src→dst link (the caller commits). Both regions must exist; src ==
    dst declares the region's own network between its clusters."""
    for field, name in (("src", src), ("dst", dst)):
        if session.get(Region, name) is None:
            raise NotFound(
                f"{field}: region {name!r} is not known (regions appear when an agent registers)", field=field
            )
    link = session.scalar(select(Link).where(Link.src == src, Link.dst == dst))
    if link is None:
        link = Link(src=src, dst=dst, bandwidth_gbps=bandwidth_gbps, latency_ms=latency_ms)
        session.add(link)
    link.bandwidth_gbps = bandwidth_gbps
    link.latency_ms = latency_ms
    link.egress_price_per_gb = egress_price_per_gb
    link.private = private
    link.measured_at = utcnow()
    session.flush()
    return link
