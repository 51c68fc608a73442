"""The sync settings a spec leaves to the planner ("auto"): the codec and the interval H. Pure.

Compression is chosen per spec, before any placement is known: the cheapest codec whose measured
held-out loss stays within ``LOSS_TOLERANCE`` of the same mode uncompressed at every H measured for
both (``quality.MEASURED``; unmeasured codecs are never picked). Today that is int8 with error
feedback for DiLoCo (overlapped, as real jobs run it) and no compression for the other modes.

H is chosen per option, from its local step and its exchange as the estimator prices them, among
``EVERY_LADDER`` (at most a quarter of the run, so there are rounds to average). An H is
*affordable* where its exchange costs the steps at most ``EXPOSED_SHARE`` of their time, overlap
counted, its egress adds at most ``EGRESS_SHARE`` to the devices' cost, and, where the runtime
overlaps it, it lands within ``LAG_SHARE`` of its round. Fewer exchanges send fewer WAN bytes, so
the planner takes the *largest* affordable H that the measured quality vouches for: at most the
``quality_cap`` of the setting (mode, codec, overlap), the largest H measured whose held-out loss,
and that of every smaller H measured, is within ``LOSS_TOLERANCE`` of sync's. Between measured H
the loss is bracketed by measurements; beyond the largest it is not, and DiLoCo's ablation over H
(Douillard et al. 2023) finds the loss rising with H, so the planner does not extrapolate. Where
nothing is vouched for (a mode measured worse than sync, or not measured), or no vouched H is
affordable, it takes the smallest affordable H (the exchange's time and egress bound H from below);
where none is affordable, the largest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from contracts.job_spec import AUTO, JobSpec
from contracts.sync_calibration import SyncCalibration
from control_layer.planner import cost_model as cm
from control_layer.planner.calibrated import CODEC_ORDER, LOSS_TOLERANCE, choose_codec, overlap_allowed
from control_layer.planner.plan_types import PlanOption
from control_layer.planner.quality import MEASURED
from control_layer.planner.runtime_pricing import runtime_terms, wan_per_step
from control_layer.planner.sync_settings import (
    CODEC_BYTES,
    OVERLAPPED_MODES,
    diloco_fragments,
    exchange_delay,
    payload_bytes,
)

# The H the planner chooses among: the measured settings (20, 100), DiLoCo's main setting (500)
# and steps between. Bounded both ways: nothing below 20 was measured here, and beyond 500 lies
# outside both what was measured and the paper's main setting (its ablation: a larger H, a
# higher loss).
EVERY_LADDER = (20, 50, 100, 200, 500)
# The search ranks placements at this H before each option gets its own (``choose_every``).
PROVISIONAL_EVERY = 100
MIN_ROUNDS = 4  # H is at most steps / MIN_ROUNDS where the run allows it
# A blocking exchange may add at most this share of the local step, amortised over its round.
EXPOSED_SHARE = 0.05
# An overlapped exchange lands at most this share of its round after it was sent (at least one
# step): one step in 20 kept int8 overlapped DiLoCo within 0.3 % of blocking, half a round lost
# about 1 % (BENCHMARKS.md at dabf7f7, "Sync quality").
LAG_SHARE = 0.1
# Egress an exchange bills may add at most this share to the devices' cost over its round.
EGRESS_SHARE = 0.05


@dataclass(frozen=True)
class AutoSync:
    """What a spec left to the planner: H (chosen per option) and the codec (chosen per spec,
    ``codec_reason`` saying why; empty when the spec set it)."""

    every: bool = False
    codec_reason: str = ""

    @property
    def any(self) -> bool:
        return self.every or bool(self.codec_reason)


@dataclass(frozen=True)
class SyncChoice:
    every: int | None = None  # None: the spec's own
    compression: str | None = None
    reason: str = ""


def choose_compression(mode: str, calibration: SyncCalibration | None = None) -> tuple[str, str]:
    """The cheapest codec measured within LOSS_TOLERANCE of ``mode`` uncompressed, and why: on this
    job's calibration where the spec carries one (``calibrated.choose_codec``), else the table's."""
    if calibration is not None and calibration.mode == mode:
        return choose_codec(mode, calibration)
    overlapped = mode in OVERLAPPED_MODES
    base = {h: r for (m, h, c, o), r in MEASURED.items() if m == mode and c == "none" and not o}
    for codec in CODEC_ORDER:
        if codec == "none":
            break
        mine = {h: r for (m, h, c, o), r in MEASURED.items() if m == mode and c == codec and o == overlapped}
        both = sorted(set(mine) & set(base))
        if both and all(mine[h] <= base[h] * (1 + LOSS_TOLERANCE) for h in both):
            worst = max(mine[h] / base[h] - 1 for h in both)
            return codec, (
                f"{codec}: {CODEC_BYTES[codec]:g} byte(s) a value, measured within {worst:+.1%} of "
                f"{mode} uncompressed at H={','.join(map(str, both))}"
            )
    return "none", f"none: no cheaper codec measured within {LOSS_TOLERANCE:.1%} for {mode}"


def quality_cap(mode: str, compression: str, overlap: bool) -> int | None:
    """The largest H measured for this setting such that it and every smaller H measured kept
    held-out loss within LOSS_TOLERANCE of sync's; None where the setting was not measured or its
    smallest measured H already lost more."""
    measured = sorted(
        (h, r) for (m, h, c, o), r in MEASURED.items() if (m, c, o) == (mode, compression, overlap)
    )
    cap = None
    for h, ratio in measured:
        if ratio > 1 + LOSS_TOLERANCE:
            break
        cap = h
    return cap


def every_candidates(steps: int) -> tuple[int, ...]:
    """The H values a run of ``steps`` may get: the ladder up to steps / MIN_ROUNDS, else the
    largest that still leaves MIN_ROUNDS rounds (a short run)."""
    cap = max(1, steps // MIN_ROUNDS)
    fit = tuple(h for h in EVERY_LADDER if h <= cap)
    return fit or (cap,)


def provisional(spec: JobSpec) -> tuple[JobSpec, AutoSync]:
    """The spec the search plans with: the codec chosen, H provisional (each option then gets
    its own), and what was left to the planner."""
    s = spec.sync
    if not s.chosen_by_planner:
        return spec, AutoSync()
    codec, why = choose_compression(s.mode, s.calibration) if s.compression == AUTO else (None, "")
    every = min(PROVISIONAL_EVERY, max(every_candidates(spec.training.steps)))
    if s.mode not in cm.PERIODIC_MODES:
        every = 1
    concrete = spec.model_copy(update={"sync": s.with_choices(every, codec)})
    return concrete, AutoSync(every=s.every == AUTO, codec_reason=why)


def with_every(spec: JobSpec, every: int) -> JobSpec:
    if spec.sync.every == every:
        return spec
    return spec.model_copy(update={"sync": spec.sync.model_copy(update={"every": every})})


def choose_every(
    spec: JobSpec,
    step_s: float,
    t_exchange: float,
    participants: int,
    overlap: bool,
    egress_usd: float = 0.0,
    device_usd_per_s: float = 0.0,
) -> tuple[int, str]:
    """H among ``every_candidates``: the largest affordable one at most ``quality_cap``, else the
    smallest affordable one, else the largest (module doc). Affordable: an exchange of
    ``t_exchange`` seconds costs steps of ``step_s`` (their work, no exchange) at most
    EXPOSED_SHARE of their time, its egress (``egress_usd`` an exchange) at most EGRESS_SHARE of
    the devices' cost over those steps (``device_usd_per_s``), and, when ``overlap`` (the runtime
    overlaps DiLoCo's exchange), it lands within LAG_SHARE of its round. ``spec`` has its codec
    resolved; its H is ignored. Returns H and why."""
    if spec.sync.mode not in cm.PERIODIC_MODES:
        return 1, f"{spec.sync.mode}: exchanges every step"
    candidates = every_candidates(spec.training.steps)
    if participants < 2:
        return candidates[0], "nothing crosses a link: the smallest H"
    if not (math.isfinite(t_exchange) and math.isfinite(step_s) and step_s > 0):
        return candidates[-1], "exchange or step time unknown: the largest H"
    payload = payload_bytes(spec.model.n_params, str(spec.sync.compression), spec.sync.topk_ratio)
    affordable: dict[int, str] = {}
    for h in candidates:
        terms = runtime_terms(with_every(spec, h))
        fragments = diloco_fragments(h, payload) if overlap else 1
        round_steps = max(1, h // fragments)
        delay = int(exchange_delay(round_steps, t_exchange / fragments, step_s)) if overlap else 0
        exposed = float(wan_per_step(terms, t_exchange, step_s, overlap, delay, fragments))
        lag_ok = not overlap or delay <= max(1, math.floor(LAG_SHARE * round_steps))
        egress_ok = egress_usd * terms.xps <= EGRESS_SHARE * device_usd_per_s * step_s
        if exposed <= EXPOSED_SHARE * step_s and lag_ok and egress_ok:
            lag = f", lands {delay} of {round_steps} step(s) late" if overlap else ""
            adds = f"adds {exposed / step_s:.1%} to a {step_s:.3g} s step"
            affordable[h] = f"exchange {t_exchange:.3g} s {adds}{lag}"
    mode, codec = spec.sync.mode, str(spec.sync.compression)
    cap = quality_cap(mode, codec, overlap)
    vouched = [h for h in affordable if cap is not None and h <= cap]
    if vouched:
        h = max(vouched)
        how = f"{mode} {codec}{' overlapped' if overlap else ''} up to H={cap}"
        within = f"the fewest exchanges measured within {LOSS_TOLERANCE:.1%} of sync ({how})"
        return h, f"H={h}: {within}; {affordable[h]}"
    if affordable:
        h = min(affordable)
        return h, f"H={h}: the smallest affordable; {affordable[h]}"
    long = f"exchange {t_exchange:.3g} s (${egress_usd:.3g} egress) is dear for a {step_s:.3g} s step"
    return candidates[-1], f"H={candidates[-1]}: the largest allowed; {long}"


def sync_overlaps(spec: JobSpec) -> bool:
    """Whether the spec's sync may overlap its exchange (``calibrated.overlap_allowed``)."""
    s = spec.sync
    return overlap_allowed(s.mode, str(s.compression), s.calibration)


def choice_for(
    spec: JobSpec,
    auto: AutoSync,
    step_s: float,
    t_exchange: float,
    participants: int,
    egress_usd: float = 0.0,
    device_usd_per_s: float = 0.0,
) -> SyncChoice:
    """What an option states it chose: H for its step, exchange and prices where ``auto.every``,
    and the codec ``provisional`` resolved ``spec`` to where the spec left it."""
    overlap = spec.sync.mode == "diloco" and participants >= 2 and sync_overlaps(spec)
    every, why = (
        choose_every(spec, step_s, t_exchange, participants, overlap, egress_usd, device_usd_per_s)
        if auto.every
        else (None, "")
    )
    codec = str(spec.sync.compression) if auto.codec_reason else None
    return SyncChoice(
        every=every, compression=codec, reason="; ".join(r for r in (why, auto.codec_reason) if r)
    )


def pinned(spec: JobSpec, option: PlanOption) -> JobSpec:
    """The spec with an option's sync settings in place of "auto": what its workers run and what
    the job keeps, so a re-placement or a replacement region trains with the same H and codec."""
    if not spec.sync.chosen_by_planner:
        return spec
    rt = option.runtime
    every = rt.sync_every if rt is not None and rt.sync_every is not None else option.sync.every
    compression = option.sync.compression
    return spec.model_copy(update={"sync": spec.sync.with_choices(every, compression)})
