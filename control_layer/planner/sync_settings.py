"""The runtime's best cross-region settings for a job's sync mode. Pure: numbers in, settings out.

DiLoCo overlaps each outer exchange with the next inner steps and, when the payload is large
enough for it to pay, streams it as fragments (Streaming DiLoCo): each fragment is sent a
fraction of a round apart, so the link carries a steady trickle instead of a burst and each
update is applied sooner. Async overlaps the parameter server's answer with the next round.
The other modes' semantics are their exchange (sync, local SGD, gossip) or already bound their
lag (SSP), so they keep blocking exchanges.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

OVERLAPPED_MODES = ("diloco", "async")
FRAGMENT_CHOICES = (4, 2, 1)
# Below this a fragment's exchange is dominated by per-call latency and streaming gains nothing.
MIN_FRAGMENT_BYTES = 4 << 20
CODEC_BYTES = {"none": 4.0, "fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "int8": 1.0}


@dataclass(frozen=True)
class SyncSettings:
    overlap: bool = False
    overlap_steps: int | None = None
    fragments: int = 1
    reason: str = ""


def payload_bytes(n_params: int, compression: str, topk_ratio: float) -> float:
    """Bytes one region sends one peer per full-model exchange."""
    if compression == "topk":
        return n_params * topk_ratio * 8.0  # value and index per kept element
    return n_params * CODEC_BYTES.get(compression, 4.0)


def exchange_s(payload: float, n_regions: int, bandwidth_bps: float, latency_s: float) -> float:
    """One region's share of a ring all-reduce of ``payload`` (reduce-scatter then all-gather over
    the planner's ring, ``training.sync.collective``): 2(R-1)/R of the payload over its uplink, in
    2(R-1) hops."""
    if n_regions < 2:
        return 0.0
    hops = 2 * (n_regions - 1)
    return hops * latency_s + hops / n_regions * payload * 8 / bandwidth_bps


def overlap_delay(exchange: float, step_s: float, round_steps: int) -> int:
    """Steps between sending an overlapped round and applying it: the fewest whole steps that hide
    the exchange (Streaming DiLoCo's small tau), at most a round. The later an outer update lands,
    the more local progress it was computed without: a round applied half a round late cost ~1 %
    held-out loss at H=20 (BENCHMARKS.md, "Sync quality")."""
    need = max(1, math.ceil(exchange / step_s - 1e-9))
    return min(max(1, round_steps), need)


def sync_settings(
    *,
    mode: str,
    every: int,
    n_regions: int,
    payload: float,
    step_s: float,
    bandwidth_bps: float | None,
    latency_s: float = 0.0,
) -> SyncSettings:
    """Settings for a job whose ``n_regions`` regions exchange ``payload`` bytes per round, every
    ``every`` steps of ``step_s`` seconds, over links of ``bandwidth_bps`` (None: unknown)."""
    if n_regions < 2:
        return SyncSettings(reason="one region: nothing crosses a WAN")
    if mode not in OVERLAPPED_MODES:
        return SyncSettings(reason=f"{mode}: blocking exchanges are the mode's semantics")
    if mode == "async":
        return SyncSettings(overlap=True, reason="async: the server's answer is applied one round later")
    fragments = next(
        f
        for f in FRAGMENT_CHOICES
        if f == 1 or (every % f == 0 and every // f >= 2 and payload / f >= MIN_FRAGMENT_BYTES)
    )
    round_steps = every // fragments
    if bandwidth_bps is None or bandwidth_bps <= 0 or step_s <= 0 or not math.isfinite(step_s):
        delay = max(1, round_steps // 2)
        why = "link or step time unknown: half a round"
    else:
        t = exchange_s(payload / fragments, n_regions, bandwidth_bps, latency_s)
        delay = overlap_delay(t, step_s, round_steps)
        need = max(1, math.ceil(t / step_s - 1e-9))
        why = f"an exchange takes ~{t:.3g} s, {need} step(s) of {step_s:.3g} s"
        if need > round_steps:
            why += f"; more than a round ({round_steps} steps): the rest blocks"
    return SyncSettings(
        overlap=True,
        overlap_steps=delay,
        fragments=fragments,
        reason=f"diloco: {fragments} fragment(s), applied {delay} step(s) after sending ({why})",
    )
