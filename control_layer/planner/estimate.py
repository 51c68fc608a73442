"""Estimate a concrete placement (a task list): the single source of truth for an option's numbers.

The search evaluates the same formulas over whole clusters at once; this module evaluates them
for the devices actually chosen, and the orchestration layer can call it to re-price a plan.
An estimate is a few named steps: the replicas' local steps (``local_step``), the exchange
(``sync_cost``), the runtime settings chosen from both (``runtime_settings``, ``sync_choice``),
the step with the exchange's exposed part and the regions' drift, the run's fixed seconds, and
its cost. The formulas, and the symbols the code keeps from them, are in docs/cost-model.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from contracts.errors import InvalidArgument
from contracts.feasibility import STAGE_SYNC_MODES
from contracts.job_spec import JobSpec
from control_layer.planner import cost_model as cm
from control_layer.planner.cross_cluster import wan_messages
from control_layer.planner.host_shares import shares_of
from control_layer.planner.intervals import basis, interval
from control_layer.planner.links import Links
from control_layer.planner.local_step import LocalStep, local_steps, n_micro_batches
from control_layer.planner.node_groups import node_groups
from control_layer.planner.placement import Placement
from control_layer.planner.plan_types import (
    Calibration,
    CostBreakdown,
    Estimates,
    RuntimeSettings,
    StepBreakdown,
)
from control_layer.planner.replicas import Participant, Replica, group_sizes, replicas_of, spec_at_precision
from control_layer.planner.runtime_pricing import (
    RuntimeTerms,
    drift_per_step,
    final_sync_s,
    overlapped_exchange_s,
    runtime_terms,
    wan_per_step,
)
from control_layer.planner.runtime_settings import settings_for, weakest_link
from control_layer.planner.snapshot import ClusterInfo, NodeInfo
from control_layer.planner.sync_choice import (
    AutoSync,
    SyncChoice,
    choice_for,
    provisional,
    sync_overlaps,
    with_every,
)
from control_layer.planner.sync_cost import SyncCost, exchange_cost


def device_price(cluster: ClusterInfo, spot: bool) -> float:
    if spot and cluster.spot_price_per_device_hour is not None:
        return min(cluster.price_per_device_hour, cluster.spot_price_per_device_hour)
    return cluster.price_per_device_hour


def hourly_price(replicas: Sequence[Replica], spot: bool) -> float:
    """USD per hour of every device the replicas hold, each at its own cluster's price (a replica
    across clusters pays each cluster for its devices there)."""
    return sum(device_price(cluster, spot) for rep in replicas for cluster, _ in rep.devices)


def estimate_option(placement: Placement, runtime: RuntimeSettings | None = None) -> Estimates:
    """Time, cost and memory of running the placement's spec on exactly its tasks, with the given
    runtime settings (checkpoint interval, overlap); without them, as the spec alone says.

    The spec's precision 'auto' resolves on these devices (``contracts.feasibility``).
    Raises InvalidArgument when the tasks are not a complete dp×pp×tp grid, a replica mixes
    device models or spans nodes, a device runs out of memory, or two participating regions have
    no link.
    """
    spec = placement.spec
    # "auto" sync settings: the runtime's, where it states them, else the planner's provisional ones.
    chosen = spec.sync.with_choices(
        runtime.sync_every if runtime else None, runtime.sync_compression if runtime else None
    )
    spec = provisional(spec.model_copy(update={"sync": chosen}))[0]
    return _estimate(placement.with_spec(spec), runtime, derive=False)[0]


def estimate_planned(
    placement: Placement,
    replicas: list[Replica] | None = None,
    auto: AutoSync | None = None,
    groups: list[list[str]] | None = None,
) -> tuple[Estimates, RuntimeSettings]:
    """The runtime settings the placement's tasks get (``runtime_settings.settings_for``, from
    their own local step, nodes and links) and the estimates priced with them, in one pass.
    ``replicas``, when the caller built the tasks from them, saves re-deriving (and re-checking)
    them; ``groups``, their ``node_groups``, likewise. A spec that leaves sync settings to the
    planner ("auto") gets them chosen here for these tasks (``sync_choice``); ``auto`` says which,
    for a spec the caller already resolved provisionally."""
    if auto is None:
        spec, auto = provisional(placement.spec)
        placement = placement.with_spec(spec)
    est, runtime = _estimate(placement, None, derive=True, replicas=replicas, auto=auto, groups=groups)
    assert runtime is not None
    return est, runtime


@dataclass(frozen=True)
class _Resolved:
    """A placement as every step of its estimate reads it: its spec at the precision it runs, its
    replicas and their torchrun groups (the sync participants), each node's host share σ for its
    workers and for its launcher, and the links between the participants."""

    placement: Placement
    precision: str
    replicas: list[Replica]
    group_size: dict[Participant, int]
    shares: dict[str, float]
    launch_shares: dict[str, float]
    links: Links
    known_groups: list[list[str]] | None = None  # ``node_groups`` of the tasks, where already read

    @cached_property
    def groups(self) -> list[list[str]]:
        """The tasks' torchrun groups' nodes (``node_groups``), read once per estimate."""
        known = self.known_groups
        return node_groups(self.placement.tasks) if known is None else known

    @cached_property
    def node_ids(self) -> list[str]:
        return sorted(dict.fromkeys(n for rep in self.replicas for n in rep.all_nodes))

    @cached_property
    def sync_regions(self) -> list[str]:
        """The regions of the sync participants."""
        clusters = self.placement.snapshot.clusters_by_id()
        return sorted({clusters[cluster_id].region for cluster_id, _, _ in self.group_size})


def _check_batch_split(spec: JobSpec, dp: int) -> None:
    batch = spec.global_batch_sequences
    if dp < 1 or batch % dp or (batch // dp) % spec.training.micro_batch_size:
        raise InvalidArgument(
            f"dp={dp} does not split {batch} sequences into micro-batches of "
            f"{spec.training.micro_batch_size}",
            field="dp",
        )


def _resolved(
    placement: Placement, replicas: list[Replica] | None, groups: list[list[str]] | None = None
) -> _Resolved:
    _check_batch_split(placement.spec, placement.dp)
    snapshot, tasks = placement.snapshot, placement.tasks
    if replicas is None:
        groups = node_groups(tasks)
        replicas = replicas_of(snapshot, tasks, placement.dp, placement.tp, placement.pp, groups)
    spec, precision = spec_at_precision(placement.spec, replicas)
    group_size = group_sizes(replicas)
    shares = shares_of(snapshot, tasks, replicas)
    launch_shares = shares_of(snapshot, tasks, replicas, one_per_node=True)
    # An exchange's calls run on the leaders: the slowest leader's host share slows them.
    links = Links(
        snapshot, placement.calibration, max(shares.get(leader, 1.0) for _, leader, _ in group_size)
    )
    return _Resolved(
        placement.with_spec(spec), precision, replicas, group_size, shares, launch_shares, links, groups
    )


def _estimate(
    placement: Placement,
    runtime: RuntimeSettings | None,
    derive: bool,
    replicas: list[Replica] | None = None,
    auto: AutoSync | None = None,
    groups: list[list[str]] | None = None,
) -> tuple[Estimates, RuntimeSettings | None]:
    """The estimate of the placement with ``runtime``'s settings, or, where ``derive``, with the
    settings chosen here from its local step and exchange (returned beside it)."""
    plan = _resolved(placement, replicas, groups)
    spec = plan.placement.spec
    # No reference step measured: checkpoint writes at the runtime's own estimate.
    default_write_s = (
        runtime_terms(spec).write_s if derive else runtime.checkpoint_write_s if runtime is not None else 0.0
    )
    steps, peak_bytes = local_steps(
        plan.placement, plan.replicas, plan.group_size, plan.shares, plan.precision, default_write_s
    )
    # Only a pipeline across nodes in a dense mode may sync per stage: only then are its groups read.
    spans = (
        plan.placement.pp > 1 and spec.sync.mode in STAGE_SYNC_MODES and any(r.nodes for r in plan.replicas)
    )
    exchange = exchange_cost(
        plan.placement, list(plan.group_size), plan.shares, plan.links, plan.groups if spans else None, spans
    )
    beside_s = _beside_steps_s(exchange)
    if derive:
        spec, runtime = _planned_runtime(plan, steps, exchange, beside_s, auto)
    step, timed = _step(plan, spec, runtime, steps, exchange, beside_s)
    return _estimates(plan, spec, step, timed, peak_bytes), runtime


def _beside_steps_s(exchange: SyncCost) -> float:
    """Seconds of the exchange beside the steps: on a host with no idle core, its CPU work takes
    turns with the leader's training thread (``overlapped_exchange_s``)."""
    parts = exchange.basis
    work_s = (parts.fixed_s + parts.params * parts.param_s) * parts.share
    return float(overlapped_exchange_s(exchange.t_sync, work_s, parts.share))


def _sync_choice(
    plan: _Resolved, auto: AutoSync, work: float, exchange: SyncCost, beside_s: float
) -> SyncChoice:
    """H and the codec the spec left to the planner, for this option's step and exchange."""
    spec = plan.placement.spec
    n_nodes = len(plan.node_ids)
    # H from the exchange as the steps see it: beside them where DiLoCo overlaps it.
    beside = spec.sync.mode == "diloco" and n_nodes >= 2 and sync_overlaps(spec)
    hourly_usd = hourly_price(plan.replicas, plan.placement.spot)
    return choice_for(
        spec,
        auto,
        work,
        beside_s if beside else exchange.t_sync,
        n_nodes,
        egress_usd=exchange.egress_usd,
        device_usd_per_s=hourly_usd / 3600.0,
    )


def _planned_runtime(
    plan: _Resolved, steps: list[LocalStep], exchange: SyncCost, beside_s: float, auto: AutoSync | None
) -> tuple[JobSpec, RuntimeSettings]:
    """The runtime settings the option's workers get, and its spec with the H chosen for it."""
    spec = plan.placement.spec
    work = max(step.work for step in steps)
    bandwidth, latency = weakest_link(set(plan.sync_regions), plan.placement.snapshot)
    # The delay from the exchange as priced here (calibrated goodput and per-call seconds, and its
    # CPU beside the steps): the search's objective ranks by the blocking figure
    # (``problem.runtime_step``).
    t_exchange = beside_s if math.isfinite(beside_s) else None
    choice = None
    if auto is not None and auto.any:
        choice = _sync_choice(plan, auto, work, exchange, beside_s)
        if choice.every is not None:
            spec = with_every(spec, choice.every)
    runtime = settings_for(spec, work, len(plan.node_ids), bandwidth, latency, t_exchange)
    if choice is not None:
        runtime = runtime.model_copy(
            update={
                "sync_every": choice.every,
                "sync_compression": choice.compression,
                "sync_choice": choice.reason,
            }
        )
    return spec, runtime


@dataclass(frozen=True)
class _TimedExchange:
    """The exchange as the run meets it: with the regions' drift over a round where it blocks
    (``t_sync``), beside the steps where it overlaps them, and once more at the end."""

    cost: SyncCost
    beside_s: float
    t_sync: float
    overlapped: bool
    every: int  # H: steps between exchanges
    drift: float  # the share of a round's local steps the first region waits for the last
    drift_fixed_s: float  # and the fixed seconds per round, per idle core
    drift_s: float
    final_s: float  # the last exchange, which no step after it hides


def _timed_exchange(
    plan: _Resolved,
    terms: RuntimeTerms,
    runtime: RuntimeSettings | None,
    exchange: SyncCost,
    beside_s: float,
    t_local: float,
) -> _TimedExchange:
    """Regions that exchange every H steps drift apart over those steps; at a blocking exchange
    the first to arrive waits for the last (calibrated per region pair, 0 until runs show it). An
    overlapped round hides its exchange, not that lag: the run waits for the last region all the
    same (``runtime_pricing.drift_per_step``). The lag has a part that grows with the round's
    steps and a fixed part per round at the leaders' host share (``drift_fit``), learned apart
    for rounds that overlap the steps."""
    overlapped = bool(runtime is not None and runtime.overlap and terms.diloco)
    every = cm.sync_every(terms.spec.sync)
    regions, calibration = plan.sync_regions, plan.placement.calibration
    drift = drift_fixed = 0.0
    if every > 1 and len(regions) >= 2:
        drift = cm.exchange_drift(regions, calibration, overlapped)
        drift_fixed = cm.exchange_drift_fixed_s(regions, calibration, overlapped)
    drift_s = drift * every * t_local + drift_fixed * max(1.0, exchange.basis.share)
    t_sync = exchange.t_sync + (0.0 if overlapped else drift_s)
    final_s = float(final_sync_s(terms, t_sync, overlapped, len(plan.group_size)))
    return _TimedExchange(exchange, beside_s, t_sync, overlapped, every, drift, drift_fixed, drift_s, final_s)


def _exchange_per_step(
    terms: RuntimeTerms, runtime: RuntimeSettings | None, timed: _TimedExchange, work: float
) -> float:
    """Seconds a step waits for the exchange. What the exchange hides behind is the steps' work: a
    checkpoint write comes once in many rounds, so its amortised share would hide a round's
    exchange that no step covers."""
    overlapped = timed.overlapped
    wan = float(
        wan_per_step(
            terms,
            timed.beside_s if overlapped else timed.t_sync,
            work,
            overlapped,
            runtime.overlap_steps or 0 if runtime is not None else 0,
            runtime.fragments if runtime is not None else 1,
        )
    )
    if overlapped:
        wan += float(drift_per_step(terms, timed.drift_s))
    return wan


def _step(
    plan: _Resolved,
    spec: JobSpec,
    runtime: RuntimeSettings | None,
    steps: list[LocalStep],
    exchange: SyncCost,
    beside_s: float,
) -> tuple[StepBreakdown, _TimedExchange]:
    """The slowest replica's step by part, with its checkpoint writes at the runtime's interval
    and the exchange's exposed part."""
    n_steps = spec.training.steps
    every = runtime.checkpoint_every if runtime is not None else spec.training.checkpoint_every
    writes_per_step = cm.checkpoint_writes(n_steps, every) / n_steps
    slowest = max(steps, key=lambda step: step.total(writes_per_step))
    terms = runtime_terms(spec)
    timed = _timed_exchange(plan, terms, runtime, exchange, beside_s, slowest.total(writes_per_step))
    parts = slowest.replica
    step = StepBreakdown(
        data=slowest.data,
        compute=float(parts.compute),
        optimizer=slowest.optimizer,
        tp_comm=float(parts.tp_comm),
        dp_comm=float(parts.dp_comm),
        pp_bubble=float(parts.pp_bubble),
        pp_comm=float(parts.pp_comm),
        wan_sync=_exchange_per_step(terms, runtime, timed, slowest.work),
        checkpoint=slowest.write_s * writes_per_step,
    )
    return step, timed


def _fixed_seconds(
    node: NodeInfo, share: float, launch_share: float, calibration: Calibration | None
) -> tuple[float, float]:
    """A node's start-up and teardown for this plan: per idle core (calibrated, else as measured at
    registration: the start-up already per idle core, the teardown's wall time divided by the load
    it measured under), times this plan's share of the host: the launcher's part of the start-up
    at ``launch_share`` (one process per node then), the workers' part and the teardown at ``share``."""
    prof = node.profile
    under = max(1.0, prof.host_load_factor) if prof else 1.0
    launcher, workers = cm.startup_parts(
        node.id, prof.startup_s if prof else None, prof.launcher_s if prof else 0.0, calibration
    )
    teardown = cm.teardown_seconds(node.id, prof.teardown_s / under if prof else None, calibration)
    return launcher * launch_share + workers * share, teardown * share


def _startup_and_teardown(plan: _Resolved) -> tuple[float, float]:
    """The run's start-up and teardown: its slowest node's."""
    nodes, calibration = plan.placement.snapshot.nodes_by_id(), plan.placement.calibration
    fixed = [
        _fixed_seconds(nodes[n], plan.shares.get(n, 1.0), plan.launch_shares.get(n, 1.0), calibration)
        for n in plan.node_ids
    ]
    return max(start for start, _ in fixed), max(stop for _, stop in fixed)


def _pipeline_egress(plan: _Resolved) -> tuple[float, float]:
    """(bytes, USD) per step of pipelines across regions: every step each micro-batch's
    activation crosses forward and its gradient back, one message per tp rank, each egress from
    its sender's region."""
    if not any(rep.boundaries for rep in plan.replicas):
        return 0.0, 0.0
    placement = plan.placement
    n_micro = n_micro_batches(placement.spec, placement.dp)
    message = (
        placement.spec.training.micro_batch_size
        * placement.spec.model.seq_len
        * placement.spec.model.d_model
        * cm.RESIDUAL_BYTES
    )
    pipe_bytes, pipe_usd = 0.0, 0.0
    for (a, b), count in wan_messages(placement.tasks, placement.snapshot.clusters_by_id()).items():
        sent = count * n_micro * message
        pipe_bytes += sent
        pipe_usd += sent / cm.GB * plan.links.egress(a, b)
    return pipe_bytes, pipe_usd


def _estimates(
    plan: _Resolved, spec: JobSpec, step: StepBreakdown, timed: _TimedExchange, peak_bytes: float
) -> Estimates:
    """The run's duration and cost from its step, and what they rest on."""
    placement = plan.placement
    n_steps = spec.training.steps
    startup, teardown = _startup_and_teardown(plan)
    duration = startup + n_steps * step.total + timed.final_s + teardown
    per_step_exchanges = cm.exchanges_per_step(spec.sync, n_steps)
    pipe_bytes, pipe_usd = _pipeline_egress(plan)
    cost = CostBreakdown(
        devices=hourly_price(plan.replicas, placement.spot) * duration / 3600.0,
        egress=(timed.cost.egress_usd * per_step_exchanges + pipe_usd) * n_steps,
    )
    exchange_basis = timed.cost.basis.model_copy(
        update={
            "blocking": not timed.overlapped,
            "every": timed.every,
            "drift": timed.drift,
            "drift_fixed_s": timed.drift_fixed_s,
        }
    )
    rests_on = basis(
        placement.tasks,
        placement.snapshot,
        plan.precision,
        placement.calibration,
        plan.shares,
        plan.launch_shares,
    )
    return Estimates(
        step_s=step,
        steps=n_steps,
        startup_s=startup,
        final_sync_s=timed.final_s,
        teardown_s=teardown,
        duration_s=duration,
        cost=cost,
        memory_per_device_gb=peak_bytes / cm.GB,
        tokens_per_s=spec.training.global_batch_tokens / step.total if step.total > 0 else 0.0,
        wan_bytes_per_step=timed.cost.wan_bytes * per_step_exchanges + pipe_bytes,
        interval=interval(duration, cost.total, placement.calibration),
        basis=rests_on.model_copy(update={"exchange": exchange_basis}),
    )
