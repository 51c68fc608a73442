"""One replica's step before the cross-participant exchange: compute, tensor-, data- and
pipeline-parallel communication, and the parts the node's reference step measured
(docs/cost-model.md, "Compute" and "Communication inside a replica and a node", where the
symbols are defined)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from contracts.errors import InvalidArgument
from contracts.job_spec import JobSpec
from control_layer.planner import cost_model as cm
from control_layer.planner.cross_cluster import node_clusters, pipe_shares, pipeline_links
from control_layer.planner.group_rings import StageRing, group_dp_comm_s, group_rings
from control_layer.planner.host_shares import shares_of
from control_layer.planner.links import intra_bytes_per_s
from control_layer.planner.placement import Placement
from control_layer.planner.plan_types import Calibration
from control_layer.planner.replicas import (
    Participant,
    Replica,
    device_slots,
    group_sizes,
    replicas_of,
    spec_at_precision,
)
from control_layer.planner.snapshot import ClusterInfo, NodeInfo, StepRateInfo


def n_micro_batches(spec: JobSpec, dp: int) -> int:
    per_replica = spec.global_batch_sequences // dp
    return max(1, per_replica // spec.training.micro_batch_size)


@dataclass(frozen=True)
class LocalStep:
    """One replica's step before the cross-region exchange: the replica's compute and
    communication, the parts the node's reference step measured (0 where it measured none), and
    the seconds one checkpoint write takes there (amortised once the interval is known)."""

    replica: cm.ReplicaTime
    data: float
    optimizer: float
    write_s: float

    @property
    def work(self) -> float:
        """Seconds per step without checkpoint writes: what the runtime settings are chosen from."""
        return float(self.replica.total) + self.data + self.optimizer

    def total(self, writes_per_step: float) -> float:
        return self.work + self.write_s * writes_per_step


def host_collective(
    node: NodeInfo, kind: str, ranks: int, tp: int, zero: int
) -> tuple[float, float, float] | None:
    """(call_s, gbps, wait_s) of the all-reduce a node of CPU slots measured between two of its
    host's ranks, where its ``ranks`` replicas all-reduce through DDP (ZeRO 0, no tp: FSDP's
    calls are others); None where the fabric's figures price them instead."""
    prof = node.profile
    if kind != "cpu" or ranks < 2 or tp != 1 or zero != 0 or prof is None:
        return None
    if prof.collective_call_s <= 0 or prof.collective_gbps <= 0:
        return None
    return prof.collective_call_s, prof.collective_gbps, prof.collective_wait_s


def rate_key(rate: StepRateInfo | None) -> tuple[float, ...] | None:
    """What of a measured rate the local step is priced from, hashable."""
    if rate is None:
        return None
    return (
        rate.tflops,
        rate.micro_batch_s,
        rate.step_s,
        rate.optimizer_s_per_mparam,
        rate.data_s_per_mtoken,
        rate.checkpoint_s_per_mparam,
    )


@dataclass(frozen=True)
class StepBasis:
    """What a replica's local step is priced from beside its stage links: its fabric (bytes/s,
    one-way seconds), the measured rate it runs at (None: the defaults) and its host share σ."""

    fabric_bw: float
    fabric_lat: float
    rate: StepRateInfo | None
    share: float


def step_basis(
    rep: Replica,
    clusters: dict[str, ClusterInfo],
    nodes: dict[str, NodeInfo],
    shares: dict[str, float],
    precision: str,
    calibration: Calibration | None,
) -> StepBasis:
    devices = rep.devices
    on = rep.all_nodes  # the nodes it runs on
    if len(on) == 1:  # a replica on one node, in one cluster (most are): what follows, spelled out
        cluster, profile = devices[0][0], nodes[on[0]].profile
        return StepBasis(
            intra_bytes_per_s(cluster, calibration),
            cluster.intra_latency_ms / 1000.0,
            profile.rates.get(precision) if profile else None,
            shares.get(on[0], 1.0) if devices[0][1].kind == "cpu" else 1.0,
        )
    spanned = [clusters[cid] for cid in sorted({c.id for c, _ in devices})]
    fabric_bw = min(intra_bytes_per_s(c, calibration) for c in spanned)
    fabric_lat = max(c.intra_latency_ms for c in spanned) / 1000.0
    # A replica across nodes runs at its slowest node's pace (the busiest stage paces the
    # pipeline); a node without a measured rate leaves the whole replica to the defaults.
    rates = [prof.rates.get(precision) if (prof := nodes[n].profile) else None for n in on]
    rate = None if any(got is None for got in rates) else min(rates, key=lambda got: got.tflops)  # type: ignore[union-attr]
    share = max(shares.get(n, 1.0) for n in on) if devices[0][1].kind == "cpu" else 1.0
    return StepBasis(fabric_bw, fabric_lat, rate, share)


@dataclass(frozen=True)
class Pace:
    """A replica's fabric and the rate its stages run at: effective FLOP/s F and fixed seconds per
    micro-batch and per step (0 where no reference step measured them)."""

    intra_bw: float
    intra_lat: float
    flops: float
    micro_batch_s: float = 0.0
    step_s: float = 0.0


def pace(rep: Replica, basis: StepBasis, precision: str, calibration: Calibration | None) -> Pace:
    slot = rep.devices[0][1]
    rate, share = basis.rate, basis.share
    if rate is None:
        tflops = min([s.tflops for _, s in rep.devices])
        flops = cm.effective_flops(tflops, slot.model, slot.kind, precision, calibration)
        return Pace(basis.fabric_bw, basis.fabric_lat, flops / share)
    # The node's reference step: its FLOP rate (the calibrated efficiency scales it, 1 until runs
    # say otherwise) and fixed costs, slowed by the share of the host's cores.
    efficiency = cm.device_efficiency(slot.model, calibration, precision, default=1.0)
    return Pace(
        basis.fabric_bw,
        basis.fabric_lat,
        rate.tflops * 1e12 * efficiency / share,
        micro_batch_s=rate.micro_batch_s * share / efficiency,
        step_s=rate.step_s * share / efficiency,
    )


def replica_time(
    placement: Placement, n_micro: int, group_size: int, pace: Pace, stage_links: cm.PipelineLinks | None
) -> cm.ReplicaTime:
    """``cm.replica_time`` at this pace: its fabric carries tp, the group's all-reduce and, where
    no ``stage_links`` say otherwise, the stage transfers."""
    return cm.replica_time(
        placement.spec,
        placement.tp,
        placement.pp,
        placement.zero,
        n_micro,
        group_size,
        pace.flops,
        pace.intra_bw,
        pace.intra_lat,
        pace.intra_bw,
        pace.intra_lat,
        micro_batch_s=pace.micro_batch_s,
        step_s=pace.step_s,
        pp_links=stage_links,
        schedule=placement.pp_schedule,
    )


@dataclass(frozen=True)
class ReplicaWalk:
    """One replica's local step as the estimate prices it, its stage links left open: what a
    search over the replica's stage order (``stage_order``) prices each candidate order with."""

    rank: int
    placement: Placement  # its spec at the precision the replica runs
    n_micro: int
    group_size: int
    pace: Pace

    @property
    def pp(self) -> int:
        return self.placement.pp

    def pp_comm(self, links: cm.PipelineLinks) -> float:
        """Seconds the stage transfers add to the step over these links (the walked schedule)."""
        parts = replica_time(self.placement, self.n_micro, self.group_size, self.pace, links)
        return float(parts.pp_comm)

    def floor_s(self) -> float:
        """The replica's step from its compute to its stage transfers (``cm.replica_time``'s
        total) were the transfers free: no order of its stages walks faster."""
        parts = replica_time(self.placement, self.n_micro, self.group_size, self.pace, None)
        return float(parts.total - parts.pp_comm)


def replica_walks(placement: Placement, replicas: list[Replica] | None = None) -> list[ReplicaWalk]:
    """Per dp rank of the placement's tasks, what ``estimate_planned`` prices its local step
    from, as it does (the same rate, host share, fabric and schedule), its stage links to be
    given. ``placement.spot`` plays no part; ``replicas``: the tasks' own, where the caller has them."""
    snapshot, tasks = placement.snapshot, placement.tasks
    if replicas is None:
        replicas = replicas_of(snapshot, tasks, placement.dp, placement.tp, placement.pp)
    spec, precision = spec_at_precision(placement.spec, replicas)
    placement = placement.with_spec(spec)
    n_micro = n_micro_batches(spec, placement.dp)
    group_size = group_sizes(replicas)
    clusters, nodes = snapshot.clusters_by_id(), snapshot.nodes_by_id()
    shares = shares_of(snapshot, tasks, replicas)
    out = []
    for rep in replicas:
        basis = step_basis(rep, clusters, nodes, shares, precision, placement.calibration)
        walk_pace = pace(rep, basis, precision, placement.calibration)
        out.append(ReplicaWalk(rep.rank, placement, n_micro, group_size[rep.participant], walk_pace))
    return out


def composition_walk(
    placement: Placement, slots: Sequence[tuple[str, str, int]], shares: dict[str, float]
) -> ReplicaWalk:
    """What one replica on these slots (cluster, node, device; in (stage, tp rank) order) would
    be priced from as a torchrun group of its own: its rate, host share (``shares``, 1 where a
    node has none) and fabric. ``placement`` gives the spec, at the precision the slots run,
    and the degrees; its tasks are not read."""
    snapshot, calibration = placement.snapshot, placement.calibration
    precision = placement.spec.training.precision
    clusters, nodes = snapshot.clusters_by_id(), snapshot.nodes_by_id()
    index = device_slots(snapshot)
    devices = [(clusters[c], index[(c, n)][d]) for c, n, d in slots]
    on = tuple(dict.fromkeys(n for _, n, _ in slots))
    rep = Replica(0, devices, (slots[0][0], on[0], devices[0][1].model), on if len(on) > 1 else ())
    basis = step_basis(rep, clusters, nodes, shares, precision, calibration)
    n_micro = n_micro_batches(placement.spec, placement.dp)
    return ReplicaWalk(0, placement, n_micro, 1, pace(rep, basis, precision, calibration))


@dataclass(frozen=True)
class ReplicaFigures:
    """Everything one replica's local step is priced from. Only the slowest local step counts, so
    replicas alike in all of it are priced once, whatever nodes or clusters hold them (node ids
    would price every profiled replica apart)."""

    replica: Replica
    basis: StepBasis
    group_size: int  # r: the replicas of its torchrun group
    stage_links: cm.PipelineLinks | None  # a replica across nodes: its boundaries
    write_fixed_s: float  # a checkpoint write's fixed part at the host share
    host_collective: tuple[float, float, float] | None
    # A group whose stage rings cross nodes (``group_rings``): per stage its slowest hop, None
    # where it stays on a node; None where every ring of the group stays on a node.
    dp_rings: tuple[StageRing | None, ...] | None = None

    def key(self) -> tuple[object, ...]:
        slots = [s for _, s in self.replica.devices]
        basis = self.basis
        return (
            basis.fabric_bw,
            basis.fabric_lat,
            rate_key(basis.rate),
            basis.share,
            slots[0].model,
            slots[0].kind,
            min([s.tflops for s in slots]),
            min([s.memory_gb for s in slots]),
            self.group_size,
            self.stage_links,
            self.write_fixed_s,
            self.host_collective,
            self.dp_rings,
        )


def replica_figures(
    placement: Placement,
    replicas: Sequence[Replica],
    group_size: dict[Participant, int],
    shares: dict[str, float],
    precision: str,
) -> Iterator[ReplicaFigures]:
    """Each replica's figures in turn (lazily: a replica's memory is checked before the next
    one's stage links are read, so the first replica at fault names the error)."""
    snapshot, calibration = placement.snapshot, placement.calibration
    clusters, nodes = snapshot.clusters_by_id(), snapshot.nodes_by_id()
    # Replicas across nodes only (``spanning``): a node's cluster and who shares its pipes.
    spanning = [rep.boundaries for rep in replicas if rep.boundaries]
    cluster_of = node_clusters(snapshot) if spanning else {}
    cluster_pipes = pipe_shares(spanning, cluster_of)
    rings = group_rings(placement, replicas, group_size)
    # What a replica's nodes give it (its basis, host collective and write), kept per place: a
    # quote's options hold hundreds of replicas on a few dozen nodes.
    per_place: dict[tuple[object, ...], tuple[StepBasis, tuple[float, float, float] | None, float]] = {}
    for rep in replicas:
        r = group_size[rep.participant]
        on = rep.all_nodes
        kind = rep.devices[0][1].kind
        place = (tuple(sorted({c.id for c, _ in rep.devices})), on, kind, r)
        got = per_place.get(place)
        if got is None:
            got = per_place[place] = _place_figures(rep, r, placement, nodes, clusters, shares, precision)
        basis, collective, write_fixed = got
        stage_links = None
        if rep.boundaries:
            stage_links = pipeline_links(
                rep.boundaries,
                cluster_of,
                nodes,
                snapshot,
                basis.fabric_bw,
                basis.fabric_lat,
                cluster_pipes,
                placement.tp,
                calibration,
            )
        yield ReplicaFigures(rep, basis, r, stage_links, write_fixed, collective, rings.get(rep.participant))


def _place_figures(
    rep: Replica,
    r: int,
    placement: Placement,
    nodes: dict[str, NodeInfo],
    clusters: dict[str, ClusterInfo],
    shares: dict[str, float],
    precision: str,
) -> tuple[StepBasis, tuple[float, float, float] | None, float]:
    """What the replica's place gives it: its clusters and nodes (``step_basis``), the host
    collective of its group of ``r`` on one node, and a checkpoint write's fixed part at the host
    share (its bytes at the measured rate)."""
    calibration, on, kind = placement.calibration, rep.all_nodes, rep.devices[0][1].kind
    basis = step_basis(rep, clusters, nodes, shares, precision, calibration)
    collective = (
        host_collective(nodes[on[0]], kind, r, placement.tp, placement.zero) if len(on) == 1 else None
    )
    write_fixed = max(cm.checkpoint_fixed_seconds(n, calibration) for n in on) * basis.share
    return basis, collective, write_fixed


def _local_step(
    placement: Placement, figures: ReplicaFigures, n_micro: int, precision: str, default_write_s: float
) -> LocalStep:
    spec, tp, pp, r = placement.spec, placement.tp, placement.pp, figures.group_size
    rate, share = figures.basis.rate, figures.basis.share
    step_pace = pace(figures.replica, figures.basis, precision, placement.calibration)
    parts = replica_time(placement, n_micro, r, step_pace, figures.stage_links)
    if figures.dp_rings is not None:
        # The group's stage rings cross nodes: each at its slowest port (``group_rings``).
        fabric = (figures.basis.fabric_bw, figures.basis.fabric_lat)
        parts = replace(parts, dp_comm=group_dp_comm_s(placement, r, figures.dp_rings, fabric))
    if rate is None:
        return LocalStep(parts, 0.0, 0.0, default_write_s)
    if figures.host_collective is not None:
        # The node's ranks all-reduce among themselves on the host's cores, not over a
        # fabric: priced from the all-reduce the node measured (``cm.host_dp_comm_s``).
        grad_bytes = cm.stage_params(spec.model, tp, pp) * cm.GRAD_BYTES
        parts = replace(parts, dp_comm=cm.host_dp_comm_s(grad_bytes, r, share, *figures.host_collective))
    data, optimizer = host_parts(rate, spec, tp, pp, placement.zero, r, n_micro)
    mparams = cm.stage_params(spec.model, tp, pp) / 1e6
    return LocalStep(
        parts,
        data=data * share,
        optimizer=optimizer * share,
        write_s=rate.checkpoint_s_per_mparam * mparams + figures.write_fixed_s,
    )


def host_parts(
    rate: StepRateInfo, spec: JobSpec, tp: int, pp: int, zero: int, group_size: int, n_micro: int
) -> tuple[float, float]:
    """A step's data and optimizer seconds on a whole device at the node's measured rates: the
    replica's tokens drawn, and the parameters its rank steps (its shard of them under ZeRO)."""
    mparams = cm.stage_params(spec.model, tp, pp) / 1e6
    opt_params = mparams / group_size if zero >= 1 else mparams
    local_tokens = n_micro * spec.training.micro_batch_size * spec.model.seq_len
    return rate.data_s_per_mtoken * local_tokens / 1e6, rate.optimizer_s_per_mparam * opt_params


def _checked_memory(placement: Placement, figures: ReplicaFigures, n_micro: int) -> float:
    """Bytes per device the replica needs; raises InvalidArgument where its smallest device
    cannot hold them."""
    spec, tp, pp, zero = placement.spec, placement.tp, placement.pp, placement.zero
    need = cm.memory_per_device(spec, tp, pp, zero, figures.group_size, n_micro, placement.pp_schedule).total
    rep = figures.replica
    smallest = min([s.memory_gb for _, s in rep.devices])
    if not cm.fits(need, smallest):
        raise InvalidArgument(
            f"dp rank {rep.rank} needs {need / cm.GB:.2f} GB per device; smallest device has "
            f"{smallest:g} GB ({cm.USABLE_MEMORY_FRACTION:.0%} usable)",
            dp_rank=rep.rank,
        )
    return need


def local_steps(
    placement: Placement,
    replicas: Sequence[Replica],
    group_size: dict[Participant, int],
    shares: dict[str, float],
    precision: str,
    default_write_s: float,
) -> tuple[list[LocalStep], float]:
    """The local step of every replica priced apart (``ReplicaFigures``), and the most bytes a
    device holds. ``placement.spec`` is at ``precision``; ``default_write_s`` is a checkpoint
    write where no reference step measured one. Raises InvalidArgument where a replica's
    devices run out of memory."""
    n_micro = n_micro_batches(placement.spec, placement.dp)
    out: list[LocalStep] = []
    peak_bytes = 0.0
    seen: set[tuple[object, ...]] = set()
    for figures in replica_figures(placement, replicas, group_size, shares, precision):
        key = figures.key()
        if key in seen:
            continue
        seen.add(key)
        out.append(_local_step(placement, figures, n_micro, precision, default_write_s))
        peak_bytes = max(peak_bytes, _checked_memory(placement, figures, n_micro))
    return out, peak_bytes
