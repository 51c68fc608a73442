"""What an option's runtime settings add to its step: checkpoint writes at the interval the policy
picks, the part of an overlapped exchange that does not hide behind the steps after it, and the
regions' drift over a round, which overlap does not hide (``drift_per_step``).

One place for both callers: the search's objective prices arrays of placements with it and the
estimator prices one placement, so the search ranks placements as their quotes price them. A
change to how the runtime overlaps or checkpoints is made here (and in the two policies it calls:
``checkpoint_policy`` for the interval, ``sync_settings`` for the delay). Pure numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from contracts.job_spec import JobSpec
from control_layer.planner import cost_model as cm
from control_layer.planner.checkpoint_policy import checkpoint_intervals, checkpoint_write_s
from control_layer.planner.sync_settings import diloco_fragments, exchange_delay, payload_bytes


@dataclass(frozen=True)
class RuntimeTerms:
    """What the spec alone fixes about its runtime settings, before any placement is known."""

    spec: JobSpec
    steps: int
    write_s: float  # one checkpoint write where the node measured no reference step
    every: int | None  # the spec's own checkpoint interval, if it set one
    diloco: bool  # DiLoCo overlaps its exchange whenever two or more participants sync
    fragments: int
    round_steps: int  # steps between a fragment's sends
    fragment_bytes: float
    xps: float  # exchanges per step, amortised


def runtime_terms(spec: JobSpec) -> RuntimeTerms:
    s = spec.sync
    payload = payload_bytes(spec.model.n_params, s.compression, s.topk_ratio)
    fragments = diloco_fragments(s.every, payload) if s.mode == "diloco" else 1
    return RuntimeTerms(
        spec=spec,
        steps=spec.training.steps,
        write_s=checkpoint_write_s(spec.model.n_params),
        every=spec.training.checkpoint_every,
        diloco=s.mode == "diloco",
        fragments=fragments,
        round_steps=max(1, s.every // fragments),
        fragment_bytes=payload / fragments,
        xps=cm.exchanges_per_step(s, spec.training.steps),
    )


def checkpoint_every(terms: RuntimeTerms, step_s) -> np.ndarray:
    """The interval the workers get: the spec's, else the policy's for this local step (clamped to
    the run)."""
    if terms.every:
        return np.full(np.shape(step_s), min(terms.every, terms.steps), dtype=np.int64)
    return checkpoint_intervals(np.asarray(step_s, dtype=float), terms.write_s, terms.steps)


def writes_per_step(terms: RuntimeTerms, step_s) -> np.ndarray:
    """Checkpoint writes per step, amortised, at the interval ``checkpoint_every`` picks (the
    final step's write included: ``cm.checkpoint_writes``). Rises with the step time, so a lower
    bound on the step gives a lower bound on the writes."""
    every = checkpoint_every(terms, step_s)
    return ((terms.steps - 1) // every + 1) / terms.steps


def checkpoint_s_per_step(terms: RuntimeTerms, step_s) -> np.ndarray:
    """Seconds of checkpoint writing per step at the runtime's own write estimate."""
    return terms.write_s * writes_per_step(terms, step_s)


def overlaps(terms: RuntimeTerms, participants) -> np.ndarray:
    """Whether the runtime overlaps the exchange: DiLoCo with two or more participants."""
    return np.asarray(terms.diloco & (np.asarray(participants) >= 2))


def delay_steps(terms: RuntimeTerms, t_sync, step_s) -> np.ndarray:
    """Steps between a fragment's send and its application, for the placement's whole exchange as
    priced (``t_sync``, not finite when a link is unknown; each fragment carries 1/fragments of
    it, as ``exposed_wan_per_step`` prices it) and its local step."""
    return exchange_delay(terms.round_steps, np.asarray(t_sync, dtype=float) / terms.fragments, step_s)


def overlapped_exchange_s(t_sync, cpu_s, share) -> np.ndarray:
    """How long an exchange takes while the steps it overlaps run: as long as a blocking one
    (``t_sync``) where the leader's host has an idle core; with none (``share`` > 1) the leader's
    training thread takes turns with the exchange's CPU work (``cpu_s``: its fixed and
    per-parameter seconds at that share, already in ``t_sync``), which then takes twice as long.
    The delay is chosen from this and the exposed part priced from it, so the runtime's landing
    step and the estimate agree."""
    t = np.asarray(t_sync, dtype=float)
    return np.where(np.asarray(share) > 1.0, t + np.asarray(cpu_s, dtype=float), t)


def exposed_wan_per_step(terms: RuntimeTerms, t_sync, t_step, delay, fragments: int) -> np.ndarray:
    """Seconds an overlapped DiLoCo exchange adds to an average step: each of a round's
    ``fragments`` carries 1/fragments of the exchange and hides behind ``delay`` steps of
    ``t_step``; what does not fit blocks (the runtime waits for it then)."""
    f = max(1, fragments)
    return f * np.maximum(0.0, np.asarray(t_sync) / f - delay * np.asarray(t_step)) * terms.xps


def drift_per_step(terms: RuntimeTerms, drift_s) -> np.ndarray:
    """Seconds an overlapped exchange's rounds add to an average step for the regions' drift
    (``drift_s``: δ · H · T_local, the last region's lag over a round's H steps): overlap hides a
    round's transfer and work behind the steps after it, not that lag, since a round completes
    only once the last region has sent and the run ends only once the last region arrives. Every
    round pays it, the last, blocking one included (``final_sync_s`` prices that round's exchange
    alone)."""
    return np.asarray(drift_s, dtype=float) * terms.xps


def wan_per_step(terms: RuntimeTerms, t_sync, t_step, overlapped, delay, fragments: int) -> np.ndarray:
    """Seconds the exchange adds to an average step: the exposed part where DiLoCo overlaps it,
    else as the sync mode prices it (``cm.wan_sync_per_step``)."""
    blocking = cm.wan_sync_per_step(terms.spec.sync, terms.steps, np.asarray(t_sync), np.asarray(t_step))
    return np.where(overlapped, exposed_wan_per_step(terms, t_sync, t_step, delay, fragments), blocking)


def final_sync_s(terms: RuntimeTerms, t_sync, overlapped, participants) -> np.ndarray:
    """An overlapped exchange hides behind the next steps, but the last one has none to hide
    behind: the run waits for it once (any exchange, between two nodes of a cluster too)."""
    hidden = np.asarray(overlapped) | cm.sync_overlapped(terms.spec.sync)
    return np.where(hidden & (np.asarray(participants) >= 2), t_sync, 0.0)
