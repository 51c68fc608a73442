"""Calibration from finished runs: measured step parts against the estimate they were quoted with. Pure.

A finished run's leaders report a per-step breakdown (data, compute, optimizer, sync wait,
checkpoint) and each task its start-up time. Against the option's estimate and the factors it was
made with (``Estimates.basis``) they give an observed value per factor:

- efficiency per "model|precision": basis × estimated compute / measured compute, where measured
  compute is the mean local step (compute [+ optimizer]) less the estimate's communication parts;
- start-up seconds per node in two parts, as the task reported them: the launcher's (spawn to the
  worker process started: one process per node, over ``basis.launch_share``) and the workers'
  (the rest to the first step, over ``basis.host_share``), and teardown seconds per node as the
  agent measured it (the result to the process group gone, over ``basis.host_share``): each per
  idle core;
- per region pair (runs that synced across regions), from two measurements (``observe_exchange``):
  goodput from the payloads' achieved bandwidth, and from the wait a blocking exchange adds beyond
  its bytes and latency the fixed seconds per exchange, per exchange call and the leader's
  seconds per parameter, fitted apart over the exchanges of different payloads and rings the pair
  has seen (``exchange_fit``), from exchanges made every step; an exchange made every H steps teaches
  instead how far the regions drift apart over those steps (the first waiting for the last),
  whether it blocks or overlaps the steps (``_observe_overlapped_drift``): a lag per round,
  fitted over the runs' round lengths as a fraction of the round plus fixed seconds per round
  (``drift_fit``), overlapped rounds apart from blocking ones (``cm.OVERLAPPED_SUFFIX``);
- a checkpoint write's fixed seconds per node (per idle core): the worker's mean write less the
  part priced by its bytes (``_observe_checkpoint``);
- the queue wait per scheduler-backed node (``observe_queue_wait``): the submit-to-start
  seconds its agent measured less what it expected at submission, learned as each task starts
  (``learn_queue_wait``: a start is known at once, and the quotes made meanwhile need it then),
  not at the job's end;
- staging per node (``observe_staging``): each item its agent fetched before launch teaches the
  part of its time that dominated it as priced, the store's rate or a fetch's fixed seconds, and
  a venv it built teaches the build's CPU seconds.

Per-step parts are the worker's totals over the run divided by its steps when its result has them
(the agent forwards per-step metrics at a bounded rate, so the stored ones are a sample).

Each factor not fitted moves toward its observation by ALPHA (an exponential decay per run, so recent runs
weigh more); a factor seen for the first time takes the observation. Every move is a history row
(old, new, observed, residual), and every finished job adds its time and cost errors, whose recent
spread is the interval of the next quotes.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from control_layer import drift_fit as df
from control_layer import exchange_fit as xf
from control_layer.planner import cost_model as cm
from control_layer.planner.plan_types import (
    Calibration,
    CalibrationBasis,
    ErrorBand,
    PlanOption,
    StagedRead,
)
from control_layer.planner.runtime_pricing import overlapped_exchange_s

ALPHA = 0.5  # weight of the newest run
RECENT_ERRORS = 20  # time/cost residuals the interval is taken from
TIMING_KEYS = ("data_s", "compute_s", "optimizer_s", "sync_s", "checkpoint_s", "wall_s")
RESULT_KEYS = ("startup_s", "launcher_s", "train_s", "final_sync_s", "teardown_s", "steps", "task_wall_s")
EFFICIENCY_RANGE = (1e-3, 1.5)  # what Calibration accepts
GOODPUT_RANGE = (1e-3, 1.5)

EFFICIENCY, STARTUP, TEARDOWN, GOODPUT = "efficiency", "startup_s", "teardown_s", "goodput"
LAUNCHER = "launcher_s"
EXCHANGE, EXCHANGE_PARAM, EXCHANGE_FIXED = "exchange_s", "exchange_param_s", "exchange_fixed_s"
# The decayed least-squares sums behind both (``exchange_fit``), keyed "a|b|<sum>".
EXCHANGE_FIT = "exchange_fit"
EXCHANGE_DRIFT = "exchange_drift"
EXCHANGE_DRIFT_FIXED = "exchange_drift_fixed_s"
# The decayed least-squares sums behind both (``drift_fit``), keyed "a|b|<sum>".
DRIFT_FIT = "drift_fit"
DRIFT_RANGE = df.DRIFT_RANGE  # the wait for the slowest region, in the local steps between exchanges
CHECKPOINT_FIXED = "checkpoint_fixed_s"
CHECKPOINT_FIXED_RANGE = (0.0, 60.0)  # one write's fixed seconds per idle core
STAGING = "staging_bps"  # per node: bytes/s the store's bytes reach it at, beyond a fetch's fixed part
STAGING_RANGE = (1e3, 1e12)  # 1 kB/s to 1 TB/s
STAGING_FIXED = "staging_fixed_s"  # per node: seconds one fetch takes beyond its bytes
STAGING_FIXED_RANGE = (0.0, 600.0)
VENV = "venv_s"  # per node: CPU seconds of one venv build (per idle core)
VENV_RANGE = (0.0, 86_400.0)
QUEUE_WAIT = "queue_wait_s"  # per node: measured queue wait less its agent's estimate at submission
QUEUE_WAIT_RANGE = (-86_400.0, 86_400.0)
# A fetched item teaches the rate, or the fixed part, only where that part is at least this share
# of its time as priced: a 160 kB shard on a 20 Mbit/s link is half each, and either read from
# it took the other's error whole.
DOMINANT = 0.8
TIME, COST = "time", "cost"


@dataclass(frozen=True)
class TaskRun:
    """One task of the finished attempt: where it ran and what its leader measured."""

    node_id: str
    region: str
    device_model: str
    steps: Sequence[dict[str, Any]]  # per-step timing dicts, in step order
    result: dict[str, Any]


@dataclass(frozen=True)
class FinishedRun:
    job_id: str
    at: datetime
    succeeded: bool
    option: PlanOption
    tasks: Sequence[TaskRun]
    actual_duration_s: float | None  # the span the ledger billed
    actual_cost: float | None


@dataclass(frozen=True)
class Factor:
    value: float
    runs: int


@dataclass(frozen=True)
class Change:
    """One history row: a factor (or a job's time/cost error) and how this run moved it."""

    at: datetime
    job_id: str
    kind: str
    key: str
    old: float | None
    new: float
    observed: float
    residual: float | None  # (observed − old) / old; for time/cost, (actual − estimate) / estimate


@dataclass(frozen=True)
class State:
    factors: dict[tuple[str, str], Factor] = field(default_factory=dict)
    # Recent (kind, residual) for time and cost, oldest first.
    errors: tuple[tuple[str, float], ...] = ()


def _num(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _clamp(value: float, bounds: tuple[float, float]) -> float:
    return min(max(value, bounds[0]), bounds[1])


def _rel(actual: float | None, estimate: float | None) -> float | None:
    if actual is None or estimate is None or estimate <= 0:
        return None
    return (actual - estimate) / estimate


def step_medians(steps: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Median of each timing part over the steady steps (the first step warms up, unless it is all)."""
    steady = steps[1:] if len(steps) > 1 else steps
    out: dict[str, float] = {}
    for key in TIMING_KEYS:
        values = [v for s in steady if (v := _num(s.get(key))) is not None]
        if values:
            # Sync waits come every H steps: their mean is the per-step cost, their median often 0.
            out[key] = statistics.fmean(values) if key == "sync_s" else statistics.median(values)
    return out


def run_means(task: TaskRun) -> dict[str, float]:
    """Per-step seconds by part: the worker's totals over the whole run divided by its steps where it
    reported them (every step counted, the sync waits of every H-th step included), else the
    medians of the per-step metrics the control plane stored (a sample of the steps)."""
    out = step_medians(task.steps)
    totals, steps = task.result.get("parts_total_s"), _num(task.result.get("steps"))
    if isinstance(totals, dict) and steps and steps > 0:
        for key in TIMING_KEYS:
            if (value := _num(totals.get(key))) is not None:
                out[key] = value / steps
    return out


def _estimated_comm(option: PlanOption) -> float:
    s = option.estimates.step_s
    return s.tp_comm + s.dp_comm + s.pp_bubble + s.pp_comm


def observe(run: FinishedRun) -> dict[tuple[str, str], float]:
    """The factor values this run implies, keyed (kind, key)."""
    option, est = run.option, run.option.estimates
    basis = est.basis
    obs: dict[tuple[str, str], list[float]] = defaultdict(list)
    est_opt = getattr(est.step_s, "optimizer", 0.0)
    reads = {r.node: r for r in est.staging.reads} if est.staging is not None else {}
    for task in run.tasks:
        med = run_means(task)
        key = f"{task.device_model}|{option.precision}"
        used = (basis.efficiency.get(key) if basis else None) or cm.device_efficiency(
            task.device_model, None, option.precision
        )
        compute = med.get("compute_s")
        if compute is not None:
            # The estimate's compute part is what the efficiency scales; the measured compute span
            # also holds the gradient all-reduce and, without its own figure, the optimizer step.
            measured = compute - _estimated_comm(option)
            estimated = est.step_s.compute + (0.0 if "optimizer_s" in med else est_opt)
            if measured > 0 and estimated > 0:
                obs[(EFFICIENCY, key)].append(_clamp(used * estimated / measured, EFFICIENCY_RANGE))
        # Start-up and teardown per idle core: the run's figure over the share of its host's cores
        # the plan was priced at (its own slots and the host's load then).
        share = (basis.host_share.get(task.node_id) if basis else None) or 1.0
        for kind, value in _observe_startup(basis, task, share).items():
            obs[(kind, task.node_id)].append(value)
        teardown = _num(task.result.get("teardown_s"))
        if teardown is not None and teardown >= 0:
            obs[(TEARDOWN, task.node_id)].append(teardown / share)
        if (write_fixed := _observe_checkpoint(run, task, share)) is not None:
            obs[(CHECKPOINT_FIXED, task.node_id)].append(write_fixed)
        for kind, values in observe_staging(task.result, reads.get(task.node_id)).items():
            obs[(kind, task.node_id)] += values
    if _exchanged(run) and basis is not None:
        goodput, _ = observe_exchange(basis, [t.result for t in run.tasks], _beside_steps(run))
        for key, value in goodput.items():
            obs[key].append(value)
        if (lag := drift_sample(run)) is not None and lag.round_s > 0:
            # What this run alone implies as a fraction of its round; the factors are a fit over
            # the runs' samples (``_learn_drift``).
            implied = _clamp(lag.lag_s / lag.round_s, DRIFT_RANGE)
            for key in basis.exchange_s:
                obs[(EXCHANGE_DRIFT, key + _drift_suffix(basis))].append(implied)
    # Several tasks on one key (replicas of one model, one node's tasks): their median.
    return {k: statistics.median(v) for k, v in obs.items()}


def observe_queue_wait(result: dict[str, Any]) -> float | None:
    """How far a scheduler-backed task's queue wait (its agent's submit-to-start seconds) landed
    from what its agent expected at submission; None where it did not queue (or says nothing)."""
    measured, expected = _num(result.get("queue_wait_s")), _num(result.get("queue_wait_estimate_s"))
    if measured is None or expected is None or measured < 0 or expected < 0:
        return None
    return _clamp(measured - expected, QUEUE_WAIT_RANGE)


def learn_queue_wait(
    state: State, node_id: str, job_id: str, at: datetime, result: dict[str, Any], alpha: float = ALPHA
) -> tuple[State, list[Change]]:
    """The state after a scheduler-backed task's start (``result``: its agent's report then), and
    the history row: its node's correction moves toward this miss as a factor does toward a run's
    observation; unchanged where the task did not queue."""
    missed = observe_queue_wait(result)
    if missed is None:
        return state, []
    old = state.factors.get((QUEUE_WAIT, node_id))
    new = missed if old is None else old.value + alpha * (missed - old.value)
    factors = dict(state.factors)
    factors[(QUEUE_WAIT, node_id)] = Factor(new, (old.runs if old else 0) + 1)
    prior = old.value if old else None
    change = Change(at, job_id, QUEUE_WAIT, node_id, prior, new, missed, _rel(missed, prior))
    return replace(state, factors=factors), [change]


def observe_staging(result: dict[str, Any], read: StagedRead | None = None) -> dict[str, list[float]]:
    """What the task's staging implies of its node's figures, per kind: the items its agent
    reported (``result["staging"]["items"]``, each ``{"kind", "bytes", "seconds", "cache_hit",
    "source", ...}``, or a bare list of those). Against the figures it was priced at (``read``), a
    fetched item's time is fixed + bytes / rate: where the bytes' part was priced at least
    ``DOMINANT`` of it, bytes over the seconds beyond the fixed part is a rate; where the fixed part
    was, the seconds beyond the bytes' part are a fixed part; between the two, neither. Without a
    read (staging not priced) an item's bytes over its seconds is a rate. Items served from the
    node's cache or read in place (file://) fetched nothing and teach nothing. A venv built, not
    found, teaches its seconds per idle core: its wall time over the host share it was priced at,
    as a start-up teaches (what that share missed of the host then is learned with it); without
    a read, its CPU seconds (``cpu_s``)."""
    got = result.get("staging")
    items = got.get("items") if isinstance(got, dict) else got
    out: dict[str, list[float]] = defaultdict(list)
    if not isinstance(items, list):
        return {}
    fixed = read.fetch_fixed_s if read is not None else 0.0
    rate = read.bytes_per_s if read is not None else None
    for item in items:
        if not isinstance(item, dict) or item.get("cache_hit"):
            continue
        seconds = _num(item.get("seconds"))
        if item.get("kind") == "venv":
            per_core = (
                seconds / read.share if read is not None and seconds is not None else _num(item.get("cpu_s"))
            )
            if per_core is not None and per_core > 0:
                out[VENV].append(_clamp(per_core, VENV_RANGE))
            continue
        size = _num(item.get("bytes"))
        if item.get("source") == "file" or size is None or seconds is None or size <= 0 or seconds <= 0:
            continue
        if rate is None:
            out[STAGING].append(_clamp(size / seconds, STAGING_RANGE))
            continue
        by_bytes = size / rate
        if by_bytes >= DOMINANT * (fixed + by_bytes):
            if seconds > fixed:
                out[STAGING].append(_clamp(size / (seconds - fixed), STAGING_RANGE))
        elif fixed >= DOMINANT * (fixed + by_bytes):
            out[STAGING_FIXED].append(_clamp(seconds - by_bytes, STAGING_FIXED_RANGE))
    return dict(out)


def _observe_checkpoint(run: FinishedRun, task: TaskRun, share: float) -> float | None:
    """One checkpoint write's fixed seconds per idle core on the task's node: its mean write (the
    worker's checkpoint seconds over the writes its steps made at the option's interval) less the
    part of a write priced by its bytes, over the share the plan was priced at. A write's fixed
    part (files opened and synced, the writer set up) is most of a small model's write, which
    the bytes alone priced at a fraction of it."""
    est, basis, runtime = run.option.estimates, run.option.estimates.basis, run.option.runtime
    totals, steps = task.result.get("parts_total_s"), _num(task.result.get("steps"))
    if basis is None or runtime is None or not isinstance(totals, dict) or not steps or steps < 1:
        return None
    spent, in_force = _num(totals.get("checkpoint_s")), basis.checkpoint_fixed_s.get(task.node_id)
    writes = cm.checkpoint_writes(int(steps), runtime.checkpoint_every)
    priced_writes = cm.checkpoint_writes(est.steps, runtime.checkpoint_every)
    if spent is None or spent < 0 or in_force is None or writes < 1 or priced_writes < 1:
        return None
    # One write as priced (the option's slowest replica): its bytes part is what the fixed part leaves.
    priced = est.step_s.checkpoint * est.steps / priced_writes
    by_bytes = max(0.0, priced - in_force * share)
    return _clamp((spent / writes - by_bytes) / share, CHECKPOINT_FIXED_RANGE)


def _observe_startup(basis: CalibrationBasis | None, task: TaskRun, share: float) -> dict[str, float]:
    """The task's start-up per idle core, in its two parts: the launcher's over the share it was
    priced at (one process per node), the workers' over theirs. A task that did not report the
    launcher's part teaches only the workers', less the launcher's part as priced."""
    startup = _num(task.result.get("startup_s"))
    if startup is None or startup < 0:
        return {}
    launch_share = (basis.launch_share.get(task.node_id) if basis else None) or share
    launcher = _num(task.result.get("launcher_s"))
    if launcher is not None and 0 <= launcher <= startup:
        return {LAUNCHER: launcher / launch_share, STARTUP: (startup - launcher) / share}
    priced = (basis.launcher_s.get(task.node_id, 0.0) if basis else 0.0) * launch_share
    return {STARTUP: max(0.0, startup - priced) / share}


def _exchange_totals(result: dict[str, Any]) -> dict[str, float] | None:
    got = result.get("exchange_totals")
    if not isinstance(got, dict):
        return None
    out = {k: v for k in ("n", "wait_s", "bytes", "transfer_s") if (v := _num(got.get(k))) is not None}
    return out if len(out) == 4 and out["n"] >= 1 else None


def _achieved_rate(totals: Sequence[dict[str, float]]) -> float | None:
    """Bytes/s the leaders' timed payloads moved at, over all of them; None where none was timed."""
    moved = sum(t["bytes"] for t in totals)
    spent = sum(t["transfer_s"] for t in totals)
    return moved / spent if moved > 0 and spent > 0 else None


def _beside_steps(run: FinishedRun) -> bool:
    """Whether the run's payloads moved on background threads beside its steps."""
    return cm.streams_beside_steps(run.option.sync.mode)


def _exchanged(run: FinishedRun) -> bool:
    basis = run.option.estimates.basis
    regions = {t.region for t in run.tasks}
    return (
        len(regions) >= 2 and basis is not None and basis.exchange is not None and basis.exchange.rounds > 0
    )


def observe_exchange(
    basis: CalibrationBasis, results: Sequence[dict[str, Any]], beside_steps: bool = False
) -> tuple[dict[tuple[str, str], float], xf.Sample | None]:
    """Goodput per region pair, and the exchange's wait beyond its transfer as a fit sample.

    The leaders time every payload that arrives (the sender starting to the last byte): bytes over
    those seconds is the achieved bandwidth, and against the bandwidth the exchange was priced at
    it gives each region pair's goodput (keyed as the estimate used it: measured or declared). The
    steps wait for a blocking exchange: per exchange, the wait beyond the regional reduce, the
    bytes at the achieved bandwidth and the link latency is what its fixed part, its calls and its
    per-parameter work cost; over the host share it was priced at, that is seconds per idle core, a
    sample of y = e + calls × c + parameters × p (``exchange_fit``). Each part keeps its own
    factor, so a payload or ring of another shape is priced right. Only a blocking exchange
    teaches any of them: an overlapped one streams while the replicas compute, so on a CPU host
    its payloads wait for the cores training holds and say little of the link. So do the payloads
    of modes the runtime moves on background threads whatever the steps do (``beside_steps``:
    gossip, ssp, async), even where the estimate prices their rounds as blocking: a gossip run's
    payloads arrived at a tenth of the rate a blocking exchange's did on the same link, and a
    goodput learned from them priced the next blocking exchanges' bytes several times too slow.
    """
    ex = basis.exchange
    assert ex is not None
    out: dict[tuple[str, str], float] = {}
    if not ex.blocking or beside_steps or ex.rounds < 1:
        return out, None
    totals = [t for r in results if (t := _exchange_totals(r)) is not None]
    # Concurrent per-stage rings: each payload moved at its ring's share of whatever pipes it shared
    # with the others, which the leaders cannot tell apart, so the payloads say nothing of a link's
    # rate; the wait beyond the transfer is read against the transfer as priced. So with a
    # hierarchical exchange: its payloads cross the regions' own hops as well as the WAN.
    rate = _achieved_rate(totals) if ex.rings == 1 and not ex.hierarchical else None
    if rate is not None and ex.bytes_per_s > 0:
        for key, used in basis.goodput.items():
            out[(GOODPUT, key)] = _clamp(used * rate / ex.bytes_per_s, GOODPUT_RANGE)
    waits = [t["wait_s"] / t["n"] for t in totals]
    sample = None
    if waits and ex.params > 0:
        bytes_s = ex.bytes / (rate or ex.bytes_per_s) if ex.bytes > 0 else 0.0
        beyond = statistics.median(waits) - ex.local_s - bytes_s - ex.latency_s
        sample = xf.Sample(rounds=ex.rounds, mparams=ex.params / 1e6, seconds=beyond / max(1.0, ex.share))
    return out, sample


def drift_sample(run: FinishedRun) -> df.Sample | None:
    """The lag per round an exchange every H > 1 steps showed (``drift_fit``), blocking or overlapped."""
    basis = run.option.estimates.basis
    if basis is None or not _exchanged(run):
        return None
    delay = run.option.runtime.overlap_steps if run.option.runtime is not None else None
    return _observe_drift(basis, run.tasks, _beside_steps(run)) or _observe_overlapped_drift(
        basis, run.tasks, delay or 0
    )


def _observe_drift(
    basis: CalibrationBasis, tasks: Sequence[TaskRun], beside_steps: bool = False
) -> df.Sample | None:
    """At a blocking exchange made every H > 1 steps, the wait beyond what the exchange itself
    costs (its transfer, calls and per-parameter work as priced) is the first region waiting for
    the last, which drifted behind over the H local steps: as a fraction of those steps, per
    region pair. An exchange every step has no room to drift (its steps are in lockstep).

    A region's wait is taken per round of the run (its total over ceil(steps / H)), not per
    exchange it counted: in gossip the regions count different numbers of exchanges (a region may
    pull more often than it is pulled), and the per-exchange wait of the one that counted fewer
    overstated the lag it waited for. The median region's, as ``_observe_overlapped_drift`` takes it.
    Payloads moved beside the steps (``beside_steps``) are taken at the rate priced: how fast they
    arrived while training held the cores is not what the round's wait was priced with."""
    ex = basis.exchange
    if ex is None or not ex.blocking or ex.every <= 1 or ex.rounds < 1:
        return None
    per_round, totals = [], []
    for r in tasks:
        t, steps = _exchange_totals(r.result), _num(r.result.get("steps"))
        if t is None or steps is None or steps < 1:
            continue
        totals.append(t)
        per_round.append(t["wait_s"] / math.ceil(steps / ex.every))
    step = _local_step(tasks)
    if not per_round or step <= 0:
        return None
    rate = (None if beside_steps else _achieved_rate(totals)) or ex.bytes_per_s
    transfer = ex.local_s + (ex.bytes / rate if ex.bytes > 0 and rate > 0 else 0.0) + ex.latency_s
    own = (ex.fixed_s + ex.rounds * ex.call_s + ex.params * ex.param_s) * max(1.0, ex.share)
    extra = statistics.median(per_round) - transfer - own
    return df.Sample(round_s=ex.every * step, share=max(1.0, ex.share), lag_s=max(0.0, extra))


def _local_step(tasks: Sequence[TaskRun]) -> float:
    """The run's local step: each task's mean step less its sync wait, the median over tasks."""
    local = [
        m["wall_s"] - m.get("sync_s", 0.0)
        for t in tasks
        if "wall_s" in (m := run_means(t)) and m["wall_s"] > 0
    ]
    return statistics.median(local) if local else 0.0


def _observe_overlapped_drift(
    basis: CalibrationBasis, tasks: Sequence[TaskRun], delay: int
) -> df.Sample | None:
    """The drift an overlapped DiLoCo run shows, per region pair, on the blocking runs' scale.

    Every region ends the run at the same blocking round, so each one's training span is its own
    work plus its waits, and that span is the slowest region's: what a typical (median) region
    waited over the run is what the slowest region's lag and the exchanges cost it together.
    Overlap hides an exchange's transfer and work behind ``delay`` steps, never that lag: a round
    cannot complete before the last region sends, and the run cannot end before the last region
    arrives. So, of the median region's total wait at its exchanges (the join at the first step
    left out), what the exchanges themselves were priced at (the last, blocking round at its own
    cost; each earlier round's part that does not hide behind ``delay`` local steps, as
    ``runtime_pricing`` prices it) is taken off, and the rest over the run's rounds of H local
    steps is δ, as ``_observe_drift`` takes it from blocking rounds."""
    ex = basis.exchange
    if ex is None or ex.blocking or ex.every <= 1 or ex.rounds < 1:
        return None
    waits = [t["wait_s"] for r in tasks if (t := _exchange_totals(r.result)) is not None]
    steps = [s for r in tasks if (s := _num(r.result.get("steps"))) is not None and s >= 1]
    step = _local_step(tasks)
    if not waits or not steps or step <= 0:
        return None
    rounds = math.ceil(statistics.median(steps) / ex.every)
    share = max(1.0, ex.share)
    cpu = (ex.fixed_s + ex.params * ex.param_s) * share
    own = (
        ex.local_s
        + (ex.bytes / ex.bytes_per_s if ex.bytes > 0 and ex.bytes_per_s > 0 else 0.0)
        + ex.latency_s
        + cpu
        + ex.rounds * ex.call_s * share
    )
    beside = float(overlapped_exchange_s(own, cpu, share))
    priced = own + (rounds - 1) * max(0.0, beside - delay * step)
    extra = statistics.median(waits) - priced
    return df.Sample(round_s=ex.every * step, share=share, lag_s=max(0.0, extra) / rounds)


def _learn_exchange(
    factors: dict[tuple[str, str], Factor], run: FinishedRun
) -> list[tuple[str, str, float | None, float, float]]:
    """Fold the run's exchange sample into each of its region pairs' sums and refit e, c, p there.
    Returns (kind, key, old, new, sample's seconds) for each fitted factor; ``factors`` is updated."""
    basis = run.option.estimates.basis
    if basis is None or not _exchanged(run):
        return []
    _, sample = observe_exchange(basis, [t.result for t in run.tasks], _beside_steps(run))
    if sample is None or basis.exchange is None or basis.exchange.every > 1:
        return []  # an exchange every H steps also waits for drifted regions (``_observe_drift``)
    moved = []
    for pair in sorted(basis.exchange_s):
        sums = {s: f.value for s in xf.STATS if (f := factors.get((EXCHANGE_FIT, f"{pair}|{s}")))}
        sums = xf.accumulate(sums, sample)
        runs = (
            factors[(EXCHANGE_FIT, f"{pair}|w")].runs if (EXCHANGE_FIT, f"{pair}|w") in factors else 0
        ) + 1
        for s, v in sums.items():
            factors[(EXCHANGE_FIT, f"{pair}|{s}")] = Factor(v, runs)
        prior = xf.Costs(
            cm.DEFAULT_EXCHANGE_FIXED_S, cm.DEFAULT_EXCHANGE_CALL_S, cm.DEFAULT_EXCHANGE_PARAM_S * 1e6
        )
        got = xf.fit(sums, prior)
        fitted = ((EXCHANGE_FIXED, got.fixed), (EXCHANGE, got.call), (EXCHANGE_PARAM, got.per_mparam / 1e6))
        for kind, value in fitted:
            old = factors.get((kind, pair))
            factors[(kind, pair)] = Factor(value, (old.runs if old else 0) + 1)
            moved.append((kind, pair, old.value if old else None, value, sample.seconds))
    return moved


def _drift_suffix(basis: CalibrationBasis) -> str:
    """Where a run's lag is kept: rounds that overlapped the steps apart from blocking ones."""
    return cm.drift_suffix(basis.exchange is not None and not basis.exchange.blocking)


def _learn_drift(
    factors: dict[tuple[str, str], Factor], run: FinishedRun
) -> list[tuple[str, str, float | None, float, float]]:
    """Fold the run's lag per round into each of its region pairs' sums and refit δ and κ there,
    those of overlapped rounds apart (``cm.OVERLAPPED_SUFFIX``): on a host with no idle core an
    overlapped round also waits for its own exchange, slowed by the training beside it, which a
    blocking round's lag does not hold, so each fit prices the rounds it learned from. Returns
    (kind, key, old, new, the run's lag seconds per round) per fitted factor; ``factors`` is
    updated."""
    basis = run.option.estimates.basis
    sample = drift_sample(run)
    if basis is None or sample is None:
        return []
    moved = []
    for pair in sorted(key + _drift_suffix(basis) for key in basis.exchange_s):
        sums = {s: f.value for s in df.STATS if (f := factors.get((DRIFT_FIT, f"{pair}|{s}")))}
        sums = df.accumulate(sums, sample)
        runs = (factors[(DRIFT_FIT, f"{pair}|w")].runs if (DRIFT_FIT, f"{pair}|w") in factors else 0) + 1
        for s, v in sums.items():
            factors[(DRIFT_FIT, f"{pair}|{s}")] = Factor(v, runs)
        got = df.fit(sums)
        for kind, value in ((EXCHANGE_DRIFT, got.fraction), (EXCHANGE_DRIFT_FIXED, got.fixed_s)):
            old = factors.get((kind, pair))
            factors[(kind, pair)] = Factor(value, (old.runs if old else 0) + 1)
            moved.append((kind, pair, old.value if old else None, value, sample.lag_s))
    return moved


def update(state: State, run: FinishedRun, alpha: float = ALPHA) -> tuple[State, list[Change]]:
    """The state after learning from ``run``, and the history rows that record how.

    Only a succeeded run moves factors (a failed one measured a partial, disturbed run); every run
    with an estimate and an actual adds its time and cost errors.
    """
    factors = dict(state.factors)
    changes: list[Change] = []
    if run.succeeded:
        for (kind, key), observed in sorted(observe(run).items()):
            if kind == EXCHANGE_DRIFT:
                continue  # fitted over the runs' samples below, with its fixed part
            old = factors.get((kind, key))
            new = observed if old is None else old.value + alpha * (observed - old.value)
            factors[(kind, key)] = Factor(new, (old.runs if old else 0) + 1)
            changes.append(
                Change(
                    run.at,
                    run.job_id,
                    kind,
                    key,
                    old.value if old else None,
                    new,
                    observed,
                    _rel(observed, old.value if old else None),
                )
            )
        # The exchange's fixed, per-call and per-parameter costs come from a fit over every run's sample, not
        # a move toward this run's: the row records the fit and, as observed, this run's seconds
        # beyond the transfer per idle core.
        for kind, key, old_value, new, seconds in _learn_exchange(factors, run) + _learn_drift(factors, run):
            changes.append(
                Change(run.at, run.job_id, kind, key, old_value, new, seconds, _rel(new, old_value))
            )
    errors = list(state.errors)
    if run.succeeded:
        est = run.option.estimates
        for kind, actual, estimate in (
            (TIME, run.actual_duration_s, est.duration_s),
            (COST, run.actual_cost, est.cost.total),
        ):
            residual = _rel(actual, estimate)
            if residual is not None and actual is not None:
                errors.append((kind, residual))
                changes.append(Change(run.at, run.job_id, kind, "job", estimate, actual, actual, residual))
    return replace(state, factors=factors, errors=tuple(_recent(errors))), changes


def _recent(errors: list[tuple[str, float]]) -> list[tuple[str, float]]:
    keep: list[tuple[str, float]] = []
    for kind in (TIME, COST):
        keep += [e for e in errors if e[0] == kind][-RECENT_ERRORS:]
    return keep


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default) of a non-empty sequence."""
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def error_band(residuals: Iterable[float]) -> ErrorBand | None:
    xs = [max(-1.0, r) for r in residuals]
    if not xs:
        return None
    return ErrorBand(p10=quantile(xs, 0.1), p90=quantile(xs, 0.9), n=len(xs))


def to_calibration(state: State) -> Calibration:
    """The planner's input: the current factors and the spread of recent errors."""
    tables: dict[str, dict[str, float]] = {
        EFFICIENCY: {},
        GOODPUT: {},
        STARTUP: {},
        LAUNCHER: {},
        TEARDOWN: {},
        EXCHANGE: {},
        EXCHANGE_PARAM: {},
        EXCHANGE_FIXED: {},
        EXCHANGE_DRIFT: {},
        EXCHANGE_DRIFT_FIXED: {},
        CHECKPOINT_FIXED: {},
        STAGING: {},
        STAGING_FIXED: {},
        VENV: {},
        QUEUE_WAIT: {},
    }
    for (kind, key), factor in state.factors.items():
        if kind in tables:
            tables[kind][key] = factor.value
    return Calibration(
        device_efficiency=tables[EFFICIENCY],
        link_goodput=tables[GOODPUT],
        startup_s=tables[STARTUP],
        launcher_s=tables[LAUNCHER],
        teardown_s=tables[TEARDOWN],
        exchange_s=tables[EXCHANGE],
        exchange_param_s=tables[EXCHANGE_PARAM],
        exchange_fixed_s=tables[EXCHANGE_FIXED],
        exchange_drift=tables[EXCHANGE_DRIFT],
        exchange_drift_fixed_s=tables[EXCHANGE_DRIFT_FIXED],
        checkpoint_fixed_s=tables[CHECKPOINT_FIXED],
        staging_bytes_per_s=tables[STAGING],
        staging_fixed_s=tables[STAGING_FIXED],
        venv_s=tables[VENV],
        queue_wait_s=tables[QUEUE_WAIT],
        time_error=error_band(r for k, r in state.errors if k == TIME),
        cost_error=error_band(r for k, r in state.errors if k == COST),
    )


def accuracy_record(run: FinishedRun) -> dict[str, Any]:
    """The job's estimate next to what happened, for time and cost, with the breakdowns."""
    est = run.option.estimates
    per_task = []
    for t in run.tasks:
        per_task.append(
            {
                "node_id": t.node_id,
                "region": t.region,
                "device_model": t.device_model,
                "step_s": run_means(t),
                **{k: v for k in RESULT_KEYS if (v := _num(t.result.get(k))) is not None},
                **({"exchange_totals": ex} if (ex := _exchange_totals(t.result)) else {}),
            }
        )
    return {
        "estimated": {
            "duration_s": est.duration_s,
            "steps": est.steps,
            "startup_s": est.startup_s,
            "final_sync_s": est.final_sync_s,
            "teardown_s": est.teardown_s,
            "cost": est.cost.total,
            "step_s": est.step_s.model_dump(),
            "cost_parts": est.cost.model_dump(),
            "interval": est.interval.model_dump() if est.interval else None,
        },
        "actual": {
            "duration_s": run.actual_duration_s,
            "cost": run.actual_cost,
            "tasks": per_task,
        },
        "error": {
            "time": _rel(run.actual_duration_s, est.duration_s),
            "cost": _rel(run.actual_cost, est.cost.total),
        },
    }
