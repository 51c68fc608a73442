"""Links between a local fleet's regions as a provider declares them, then measured by its agents."""

from __future__ import annotations

import time

import httpx


def declare_links(client: httpx.Client, regions: list[str], latency_ms: float = 40.0) -> None:
    """Every pair of ``regions`` with a declared bandwidth, latency and egress price."""
    for i, a in enumerate(regions):
        for b in regions[i + 1 :]:
            link = {"src": a, "dst": b, "bandwidth_gbps": 1.0, "latency_ms": latency_ms}
            client.put("/v1/links", json=link | {"egress_price_per_gb": 0.02}).raise_for_status()


def declare_private_region(client: httpx.Client, region: str) -> None:
    """The region's own network between its clusters, declared private: torchrun groups may span
    its clusters' nodes that declared a cross-cluster host."""
    link = {"src": region, "dst": region, "bandwidth_gbps": 10.0, "latency_ms": 0.5, "private": True}
    client.put("/v1/links", json=link).raise_for_status()


def wait_links_measured(client: httpx.Client, regions: list[str], timeout_s: float = 90) -> None:
    """Until the agents' probes have measured every pair of regions. Placement must not hang on
    which probe happened to land first: a pair still on its declared 40 ms looks far slower than
    a measured loopback pair, and a job placed in that window would follow that, not the price."""
    pairs = {frozenset((a, b)) for i, a in enumerate(regions) for b in regions[i + 1 :]}
    deadline = time.monotonic() + timeout_s
    while True:
        links = client.get("/v1/links").raise_for_status().json()
        measured = {frozenset((ln["src"], ln["dst"])) for ln in links if ln["source"] == "measured"}
        if pairs <= measured:
            return
        assert time.monotonic() < deadline, f"links still unmeasured after {timeout_s}s: {pairs - measured}"
        time.sleep(0.5)
