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

import numpy as np

from contracts.sync_config import OVERLAPPED_MODES
from contracts.sync_delay import overlap_merge_for

FRAGMENT_CHOICES = (4, 2, 1)
# Below this a fragment's exchange is dominated by per-call latency and streaming gains nothing.
MIN_FRAGMENT_BYTES = 4 << 20
# Wire bytes a value per codec. int8's values are Huffman-coded (``training.compression.codecs``):
# on the WAN workload's DiLoCo pseudo-gradients a round's coded int8 payload measured 0.917 of
# a byte a value in the first round and 0.883-0.887 after (a Gaussian 0.906, uniform noise stays
# 1.0: a chunk the coding would not shrink travels raw). Priced at the worst measured, rounded up.
CODEC_BYTES = {"none": 4.0, "fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "int8": 0.92}


@dataclass(frozen=True)
class SyncSettings:
    overlap: bool = False
    overlap_steps: int | None = None
    fragments: int = 1
    merge: str | None = None  # overlapped DiLoCo: how a late round lands (``overlap_merge_for``)
    reason: str = ""


def payload_bytes(n_params: int, compression: str, topk_ratio: float) -> float:
    """Bytes one region sends one peer per full-model exchange."""
    if compression == "topk":
        return n_params * topk_ratio * 8.0  # value and index per kept element
    return n_params * CODEC_BYTES.get(compression, 4.0)


def exchange_s(payload: float, n_regions, bandwidth_bps, latency_s):
    """One region's share of a ring all-reduce of ``payload`` (reduce-scatter then all-gather over
    the planner's ring, ``training.sync.collective``): 2(R-1)/R of the payload over its uplink, in
    2(R-1) hops. Scalars give a float; arrays (placements) an array."""
    r = np.asarray(n_regions, dtype=float)
    hops = 2 * (r - 1)
    t = np.where(r >= 2, hops * latency_s + hops / np.maximum(r, 1) * payload * 8 / bandwidth_bps, 0.0)
    return float(t) if t.ndim == 0 else t


def diloco_fragments(every: int, payload: float) -> int:
    """Streamed fragments per DiLoCo round: the most that divide the round into at least two
    steps each and keep each fragment large enough to stream."""
    return next(
        f
        for f in FRAGMENT_CHOICES
        if f == 1 or (every % f == 0 and every // f >= 2 and payload / f >= MIN_FRAGMENT_BYTES)
    )


def overlap_delay(
    round_steps: int,
    fragment_bytes: float,
    n_regions,
    bandwidth_bps,
    latency_s,
    step_s,
) -> np.ndarray:
    """``exchange_delay`` for a fragment's ring exchange over links of ``bandwidth_bps`` (≤ 0:
    unknown) and ``latency_s``, the link figures alone (no calibration)."""
    bw = np.asarray(bandwidth_bps, dtype=float)
    t = exchange_s(fragment_bytes, n_regions, np.where(bw > 0, bw, 1.0), latency_s)
    return exchange_delay(round_steps, np.where(bw > 0, t, np.inf), step_s)


def exchange_delay(round_steps: int, exchange_seconds, step_s) -> np.ndarray:
    """``contracts.sync_delay.overlap_delay_steps`` over arrays (the planner's hot path: the rule
    vectorised, held equal to it by ``tests/training/test_sync_public_api.py``). Steps between
    sending a DiLoCo fragment and applying it: the fewest whole steps of
    ``step_s`` its exchange of ``exchange_seconds`` takes, at most a round; half a round where the
    exchange (not finite) or the step time is unknown. Vectorised over placements; the one rule
    the search and the runtime settings both use, from the exchange time they price (the link's
    calibrated goodput and fixed seconds per call included, ``planner.sync_cost.sync_cost``). The
    fewest steps is Streaming DiLoCo's small tau: the later an outer update lands, the more local
    progress it was computed without (a round applied half a round late cost ~1 % held-out loss at
    H=20; BENCHMARKS.md at dabf7f7, "Sync quality")."""
    t = np.asarray(exchange_seconds, dtype=float)
    step = np.asarray(step_s, dtype=float)
    known = np.isfinite(t) & (t >= 0) & (step > 0) & np.isfinite(step)
    with np.errstate(over="ignore", invalid="ignore"):  # a vanishing step needs more than a round
        need = np.maximum(1, np.ceil(np.where(known, t, 0.0) / np.where(known, step, 1.0) - 1e-9))
    return np.where(known, np.minimum(round_steps, need), max(1, round_steps // 2)).astype(np.int64)


def sync_settings(
    *,
    mode: str,
    every: int,
    n_regions: int,
    payload: float,
    step_s: float,
    bandwidth_bps: float | None,
    latency_s: float = 0.0,
    exchange_seconds: float | None = None,
    overlap_ok: bool = True,
) -> SyncSettings:
    """Settings for a job whose ``n_regions`` regions exchange ``payload`` bytes per round, every
    ``every`` steps of ``step_s`` seconds, over links of ``bandwidth_bps`` (None: unknown).
    ``exchange_seconds``: one whole exchange as the estimate prices it (calibrated goodput and
    per-call seconds); without it, the exchange over the links' figures alone. ``overlap_ok``
    False: the job's own calibration measured overlap beyond the loss tolerance
    (``planner.calibrated``), so rounds block."""
    if n_regions < 2:
        return SyncSettings(reason="one region: nothing crosses a WAN")
    if mode not in OVERLAPPED_MODES:
        return SyncSettings(reason=f"{mode}: blocking exchanges are the mode's semantics")
    if not overlap_ok and mode != "async":
        return SyncSettings(
            reason=f"{mode}: blocking, overlap cost more than the tolerance in the job's calibration"
        )
    if mode == "async":
        return SyncSettings(overlap=True, reason="async: the server's answer is applied one round later")
    fragments = diloco_fragments(every, payload)
    round_steps = every // fragments
    bw = bandwidth_bps if bandwidth_bps is not None else 0.0
    if exchange_seconds is not None:
        t = exchange_seconds / fragments
        delay = int(exchange_delay(round_steps, t, step_s))
    else:
        t = float(exchange_s(payload / fragments, n_regions, bw, latency_s)) if bw > 0 else math.inf
        delay = int(overlap_delay(round_steps, payload / fragments, n_regions, bw, latency_s, step_s))
    if not math.isfinite(t) or step_s <= 0 or not math.isfinite(step_s):
        why = "link or step time unknown: half a round"
    else:
        ratio = t / step_s
        need = max(1, math.ceil(ratio - 1e-9)) if math.isfinite(ratio) else math.inf
        why = f"an exchange takes ~{t:.3g} s, {need} step(s) of {step_s:.3g} s"
        if need > round_steps:
            why += f"; more than a round ({round_steps} steps): the rest blocks"
    merge = overlap_merge_for(delay, round_steps)
    return SyncSettings(
        overlap=True,
        overlap_steps=delay,
        fragments=fragments,
        merge=merge,
        reason=f"diloco: {fragments} fragment(s), applied {delay} step(s) after sending, {merge} ({why})",
    )
