"""A task list as the estimate reads it: one ``Replica`` per dp rank, its devices and the torchrun
group (participant) it averages gradients with every step."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from itertools import pairwise

from contracts.errors import InvalidArgument
from contracts.feasibility import resolve_precision
from contracts.job_spec import JobSpec
from control_layer.planner.cross_cluster import declared_nodes, private_between
from control_layer.planner.node_groups import group_problem, node_group_problems, node_groups, rank_key
from control_layer.planner.plan_types import PlannedTask, Slot
from control_layer.planner.snapshot import ClusterInfo, DeviceSlot, ResourceSnapshot

# Key of the group of replicas that average gradients every step: the replicas on one node (one
# torchrun group) of one device model: (cluster id, node id, device model).
Participant = tuple[str, str, str]


@dataclass(frozen=True)
class Replica:
    """One dp rank: its devices in (stage, tp rank) order and the group it averages with every step."""

    rank: int
    devices: list[tuple[ClusterInfo, DeviceSlot]]
    participant: Participant  # (cluster, its torchrun group's first node, device model)
    nodes: tuple[str, ...] = ()  # every node it runs on, when more than the participant's
    # Per stage boundary (stage order), the (sending node, receiving node) of each tp rank's
    # transfer, when the replica spans nodes; () otherwise.
    boundaries: tuple[tuple[tuple[str, str], ...], ...] = ()

    @property
    def all_nodes(self) -> tuple[str, ...]:
        return self.nodes or (self.participant[1],)


def device_slots(snapshot: ResourceSnapshot) -> dict[tuple[str, str], dict[int, DeviceSlot]]:
    """(cluster id, node id) -> device index -> slot, kept with the snapshot."""

    def build(s: ResourceSnapshot) -> dict[tuple[str, str], dict[int, DeviceSlot]]:
        return {(c.id, n.id): {d.index: d for d in n.devices} for c in s.clusters for n in c.nodes}

    return snapshot.derived("device_slots", build)


def replicas_of(
    snapshot: ResourceSnapshot,
    tasks: Sequence[PlannedTask],
    dp: int,
    tp: int,
    pp: int,
    groups: Sequence[Sequence[str]] | None = None,
) -> list[Replica]:
    """One replica per dp rank of ``tasks``. Raises InvalidArgument where the tasks are not a
    complete dp × pp × tp grid of known devices, a replica mixes device models, or nodes that
    share a replica cannot run as one torchrun group (``node_groups.node_group_problems``).
    ``groups``: ``node_groups(tasks)``, where the caller has them."""
    clusters = snapshot.clusters_by_id()
    index = device_slots(snapshot)

    def slots_of(cid: str, node_id: str) -> dict[int, DeviceSlot]:
        if cid not in clusters:
            raise InvalidArgument(f"task names unknown cluster {cid!r}", cluster=cid)
        return index.get((cid, node_id), {})

    by_rank: dict[int, list[PlannedTask]] = defaultdict(list)
    for t in tasks:
        by_rank[t.dp_rank].append(t)
    if sorted(by_rank) != list(range(dp)):
        raise InvalidArgument(f"tasks must cover dp ranks 0..{dp - 1}", dp=dp)
    roles_needed = {(s, r) for s in range(pp) for r in range(tp)}
    out = []
    for rank in range(dp):
        group = by_rank[rank]
        # One task per role: as many tasks as roles, and every role among them.
        if len(group) != len(roles_needed) or {(t.pp_stage, t.tp_rank) for t in group} != roles_needed:
            raise InvalidArgument(f"dp rank {rank} must have one task per (pp_stage, tp_rank)", dp_rank=rank)
        devices = []
        for t in group:
            on_node = index.get((t.cluster, t.node))
            found = (slots_of(t.cluster, t.node) if on_node is None else on_node).get(t.device)
            if found is None:
                raise InvalidArgument(
                    f"task names unknown device {t.cluster}/{t.node}/{t.device}", cluster=t.cluster
                )
            devices.append((clusters[t.cluster], found))
        models = {slot.model for _, slot in devices}
        if len(models) != 1:
            raise InvalidArgument(f"dp rank {rank} mixes device models {sorted(models)}", dp_rank=rank)
        nodes = tuple(dict.fromkeys(t.node for t in sorted(group, key=rank_key)))
        boundaries: tuple[tuple[tuple[str, str], ...], ...] = ()
        if len(nodes) > 1:
            at = {(t.pp_stage, t.tp_rank): t.node for t in group}
            boundaries = tuple(
                tuple(sorted({(at[(st, r)], at[(st + 1, r)]) for r in range(tp)})) for st in range(pp - 1)
            )
        out.append(
            Replica(
                rank,
                devices,
                (group[0].cluster, nodes[0], models.pop()),
                nodes if len(nodes) > 1 else (),
                boundaries,
            )
        )
    # Nodes that share a replica run as one torchrun group (node_groups): its replicas average
    # every step over the cluster's fabric, and its first node leads it.
    groups = node_groups(tasks) if groups is None else groups
    group_problems = node_group_problems(
        tasks,
        declared_nodes(snapshot),
        lambda a, b: private_between(snapshot, clusters[a].region, clusters[b].region),
        groups,
    )
    if group_problems:
        raise InvalidArgument(group_problems[0], field="tasks")
    leader = {n: g[0] for g in groups for n in g}
    return [
        replace(r, participant=(r.participant[0], leader[r.participant[1]], r.participant[2])) for r in out
    ]


def replicas_on_slots(
    snapshot: ResourceSnapshot,
    placed: Sequence[Sequence[Slot]],
    tp: int,
    pp: int,
    memo: dict[tuple[int, int, tuple[Slot, ...]], Replica] | None = None,
) -> list[Replica]:
    """What ``replicas_of`` reads from the tasks the planner lays out on these slot lists, read
    from the lists themselves (a 70B quote prices dozens of layouts of thousands of tasks): one
    replica per list (dp rank order), its slots in (stage, tp rank) order, each list on nodes no
    other list uses, so each replica is its own torchrun group, its nodes in the order its stages
    reach them. Each node must hold one contiguous run of its list, as ``spanning`` lays them out.
    Raises InvalidArgument as ``replicas_of`` does: unknown devices, a replica mixing device
    models, a group that cannot span its nodes (``node_groups.group_problem``). ``memo``: each
    replica read before, by its rank, tp and slots (layouts that differ only in how many replicas they
    take share their first ones)."""
    clusters = snapshot.clusters_by_id()
    index = device_slots(snapshot)
    reachable = declared_nodes(snapshot)

    def private(a: str, b: str) -> bool:
        return private_between(snapshot, clusters[a].region, clusters[b].region)

    taken: set[str] = set()
    out = []
    for rank, slots in enumerate(placed):
        key = (rank, tp, tuple(slots))
        rep = memo.get(key) if memo is not None else None
        if rep is None:
            rep = _replica_on(rank, slots, tp, pp, clusters, index, reachable, private)
            if memo is not None:
                memo[key] = rep
        if not taken.isdisjoint(rep.all_nodes):
            raise ValueError(f"dp rank {rank}: each node must hold one run of one replica's slots")
        taken.update(rep.all_nodes)
        out.append(rep)
    return out


def _replica_on(
    rank: int,
    slots: Sequence[Slot],
    tp: int,
    pp: int,
    clusters: dict[str, ClusterInfo],
    index: dict[tuple[str, str], dict[int, DeviceSlot]],
    reachable: frozenset[str],
    private: Callable[[str, str], bool],
) -> Replica:
    """One replica of ``replicas_on_slots``."""
    if len(slots) != tp * pp:
        raise InvalidArgument(f"dp rank {rank} must have one task per (pp_stage, tp_rank)", dp_rank=rank)
    devices = []
    for c, n, d in slots:
        found = index.get((c, n), {}).get(d)
        if found is None or c not in clusters:
            raise InvalidArgument(f"task names unknown device {c}/{n}/{d}", cluster=c)
        devices.append((clusters[c], found))
    models = {slot.model for _, slot in devices}
    if len(models) != 1:
        raise InvalidArgument(f"dp rank {rank} mixes device models {sorted(models)}", dp_rank=rank)
    nodes = tuple(dict.fromkeys(n for _, n, _ in slots))
    if 1 + sum(a[1] != b[1] for a, b in pairwise(slots)) != len(nodes):
        raise ValueError(f"dp rank {rank}: each node must hold one run of one replica's slots")
    boundaries: tuple[tuple[tuple[str, str], ...], ...] = ()
    if len(nodes) > 1:
        problem = group_problem(list(nodes), sorted({c for c, _, _ in slots}), reachable, private)
        if problem is not None:
            raise InvalidArgument(problem, field="tasks")
        boundaries = tuple(
            tuple(sorted({(slots[st * tp + r][1], slots[(st + 1) * tp + r][1]) for r in range(tp)}))
            for st in range(pp - 1)
        )
    return Replica(
        rank, devices, (slots[0][0], nodes[0], models.pop()), nodes if len(nodes) > 1 else (), boundaries
    )


def spec_at_precision(spec: JobSpec, replicas: Sequence[Replica]) -> tuple[JobSpec, str]:
    """The spec at the precision its 'auto' resolves to on these replicas' devices."""
    precision = resolve_precision(spec.training.precision, {s.kind for r in replicas for _, s in r.devices})
    if precision != spec.training.precision:
        spec = spec.model_copy(update={"training": spec.training.model_copy(update={"precision": precision})})
    return spec, precision


def group_sizes(replicas: Sequence[Replica]) -> dict[Participant, int]:
    """Replicas per torchrun group (its participant): they average gradients every step."""
    group_size: dict[Participant, int] = defaultdict(int)
    for rep in replicas:
        group_size[rep.participant] += 1
    return group_size
