"""A per-link shaper in the transport.

Each ordered pair of regions (src -> dst) is a full-duplex link with a bandwidth and a one-way
latency, configured per unordered pair as ``{"a|b": {"bandwidth_mbps": 100, "latency_ms": 50}}``.
Bandwidth is enforced by pacing: a frame of n bytes occupies the link for n / rate seconds after
the previous one has left, and the sender waits until its frame has "left" before handing it to
gRPC. Latency is a one-way delay paid once per message before its first byte (a stream of chunks
pipelines behind it, as on a real path). Concurrent messages on one link share its rate.
"""

from __future__ import annotations

import threading
import time

from contracts.links import LinkSpec, link_key, parse_links

SLACK_S = 0.025


class _Pacer:
    def __init__(self, bytes_per_s: float) -> None:
        self.rate = bytes_per_s
        self.lock = threading.Lock()
        self.free_at = 0.0  # when the link has finished sending everything handed to it

    def occupy(self, nbytes: int) -> float:
        with self.lock:
            # A sender that was late by up to SLACK_S (serialising, scheduling) may catch up: the
            # link's schedule, not the sender's hiccups, sets the rate (a token bucket of that depth).
            now = time.perf_counter()
            start = self.free_at if self.free_at >= now - SLACK_S else now  # idle link: no credit
            self.free_at = start + nbytes / self.rate
            return self.free_at


class LinkShaper:
    """Shapes traffic leaving ``region`` (and answers that it sends back on a peer's request)."""

    def __init__(self, links: dict[str, LinkSpec] | None = None, *, pace_bandwidth: bool = True) -> None:
        # pace_bandwidth=False: the kernel (tc tbf) enforces the rate; only latency is emulated here.
        self.links = parse_links(links or {})
        self.pace_bandwidth = pace_bandwidth
        self._pacers: dict[tuple[str, str], _Pacer] = {}
        self._lock = threading.Lock()

    def spec(self, src: str, dst: str) -> LinkSpec | None:
        return self.links.get(link_key(src, dst))

    def latency_s(self, src: str, dst: str) -> float:
        spec = self.spec(src, dst)
        return 0.0 if spec is None else spec.latency_ms / 1e3

    def rate_bytes_per_s(self, src: str, dst: str) -> float | None:
        spec = self.spec(src, dst)
        return None if spec is None else spec.bytes_per_s

    def propagate(self, src: str, dst: str) -> None:
        """The one-way delay of a message (or of an answer) on this link."""
        delay = self.latency_s(src, dst)
        if delay > 0:
            time.sleep(delay)

    def pace(self, src: str, dst: str, nbytes: int) -> None:
        """Block until ``nbytes`` more have left on src -> dst at the link's rate."""
        if not self.pace_bandwidth:
            return
        rate = self.rate_bytes_per_s(src, dst)
        if rate is None:
            return
        with self._lock:
            pacer = self._pacers.setdefault((src, dst), _Pacer(rate))
        done = pacer.occupy(nbytes)
        delay = done - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
