"""Which nodes run one torchrun group, and in which node-rank order.

Nodes that share a replica (its tensor or pipeline group crosses them) must be one process group;
every other node is a group of its own. Inside a group the worker lays world ranks out
(pp, dp, tp), tp fastest (``training.parallel.dims``), and torchrun numbers ranks node by node in
node-rank order, so each node must hold one contiguous block of that order: a pipeline across two
nodes puts its first stages on node rank 0 and the rest on node rank 1. Pure.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from itertools import pairwise

from contracts.feasibility import STAGE_SYNC_MODES, syncs_per_stage
from contracts.worker_config import MAX_GROUP_NODES
from control_layer.planner.plan_types import PlannedTask


def rank_key(entry: PlannedTask) -> tuple[int, int, int]:
    """An entry's place in its group's rank order: stage, then replica, then tensor shard."""
    return (entry.pp_stage, entry.dp_rank, entry.tp_rank)


def node_groups(tasks: Iterable[PlannedTask]) -> list[list[str]]:
    """Node ids per process group, each in node-rank order; groups ordered by their first replica."""
    by_node: dict[str, list[PlannedTask]] = {}
    for t in tasks:
        by_node.setdefault(t.node, []).append(t)
    parent = {n: n for n in by_node}

    def root(n: str) -> str:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    first_node: dict[int, str] = {}
    for node, entries in by_node.items():
        for e in entries:
            other = first_node.setdefault(e.dp_rank, node)
            parent[root(node)] = root(other)
    groups: dict[str, list[str]] = {}
    for node in by_node:
        groups.setdefault(root(node), []).append(node)
    # Each node's first rank (``rank_key`` spelled out: this runs over every task of a quote's options).
    first_rank = {n: min([(e.pp_stage, e.dp_rank, e.tp_rank) for e in es]) for n, es in by_node.items()}
    ordered = [sorted(nodes, key=lambda n: (first_rank[n], n)) for nodes in groups.values()]
    return sorted(ordered, key=lambda nodes: min(e.dp_rank for n in nodes for e in by_node[n]))


def stage_leader_nodes(tasks: Iterable[PlannedTask], nodes: Collection[str]) -> list[str]:
    """Per pipeline stage, the node of ``nodes`` (one group) holding the stage's leader: the stage's
    first rank in the group's rank order (its first replica, tensor shard 0)."""
    first: dict[int, PlannedTask] = {}
    for t in tasks:
        if t.node in nodes and (t.pp_stage not in first or rank_key(t) < rank_key(first[t.pp_stage])):
            first[t.pp_stage] = t
    return [first[s].node for s in sorted(first)]


def stage_leaders(tasks: Iterable[PlannedTask], groups: Sequence[Sequence[str]]) -> list[list[str]]:
    """``stage_leader_nodes`` of every group at once (one pass over the tasks), groups in order."""
    group_of = {n: i for i, g in enumerate(groups) for n in g}
    first: dict[tuple[int, int], PlannedTask] = {}
    for t in tasks:
        key = (group_of[t.node], t.pp_stage)
        was = first.get(key)
        if was is None or rank_key(t) < rank_key(was):
            first[key] = t
    out: list[list[str]] = [[] for _ in groups]
    for (g, _), t in sorted(first.items()):
        out[g].append(t.node)
    return out


def per_stage_sync(
    tasks: Sequence[PlannedTask], mode: str, pp: int, groups: Sequence[Sequence[str]] | None = None
) -> bool:
    """Whether the job's groups sync stage by stage (``contracts.feasibility.syncs_per_stage``): a
    dense mode, several groups, and a group whose stages' leaders are on different nodes.
    ``groups``: ``node_groups(tasks)``, where the caller has them."""
    if pp < 2 or mode not in STAGE_SYNC_MODES:  # nothing to split: skip grouping every quote's tasks
        return False
    groups = node_groups(tasks) if groups is None else groups
    split = any(
        len(g) > 1 and len(set(leaders)) > 1
        for g, leaders in zip(groups, stage_leaders(tasks, groups), strict=True)
    )
    return syncs_per_stage(mode=mode, participants=len(groups), pp=pp, stage_leaders_split=split)


def node_group_problems(
    tasks: Sequence[PlannedTask],
    reachable: Collection[str] = (),
    private: Callable[[str, str], bool] | None = None,
    groups: Sequence[Sequence[str]] | None = None,
) -> list[str]:
    """Why these tasks cannot run as torchrun groups: a device given two roles, a group that cannot
    span its nodes (``group_problem``), or a node whose devices are not one contiguous block of
    the group's rank order. ``groups``: ``node_groups(tasks)``, where the caller has them."""
    by_node: dict[str, list[PlannedTask]] = {}
    for t in tasks:
        by_node.setdefault(t.node, []).append(t)
    roles = Counter((t.cluster, t.node, t.device) for t in tasks)
    problems = [f"device {c}/{n}/{d} is given {k} roles" for (c, n, d), k in sorted(roles.items()) if k > 1]
    for nodes in node_groups(tasks) if groups is None else groups:
        if len(nodes) == 1:
            continue
        clusters = sorted({e.cluster for n in nodes for e in by_node[n]})
        problem = group_problem(nodes, clusters, reachable, private)
        if problem is not None:
            problems.append(problem)
            continue
        # Each node's ranks sorted, the nodes in group order: they are one contiguous block each
        # exactly when every block ends where the next begins (or before).
        blocks = [sorted([(e.pp_stage, e.dp_rank, e.tp_rank) for e in by_node[n]]) for n in nodes]
        if any(a[-1] > b[0] for a, b in pairwise(blocks)):
            problems.append(
                f"nodes {nodes} do not each hold a contiguous block of (stage, replica, shard) ranks;"
                " torchrun numbers a group's ranks node by node"
            )
    return problems


def group_problem(
    nodes: Sequence[str],
    clusters: Sequence[str],
    reachable: Collection[str] = (),
    private: Callable[[str, str], bool] | None = None,
) -> str | None:
    """Why one torchrun group on ``nodes`` (of ``clusters``, sorted) cannot run, or None: a group
    across clusters (of one region or several) whose nodes did not all declare their group
    endpoint reachable from other clusters (``reachable``: those node ids,
    ``NodeInfo.cross_cluster_groups``; the declaration covers every region's clusters), or, given
    ``private`` (clusters a, b -> whether the link between their regions is declared private:
    ``cross_cluster.private_between``), one whose plaintext gloo/NCCL traffic would cross a link
    not declared private; or too many nodes."""
    closed = [n for n in nodes if n not in reachable]
    if len(clusters) > 1 and closed:
        return (
            f"nodes {list(nodes)} share replicas across clusters {list(clusters)}; a group stays in one"
            f" cluster unless all its nodes are reachable from other clusters (not {closed})"
        )
    if len(clusters) > 1 and private is not None:
        public = [(a, b) for i, a in enumerate(clusters) for b in clusters[i + 1 :] if not private(a, b)]
        if public:
            return (
                f"nodes {list(nodes)} would send their torchrun group's plaintext gloo/NCCL traffic"
                f" between clusters {public} over links not declared private (PUT /v1/links, private: true)"
            )
    if len(nodes) > MAX_GROUP_NODES:
        return f"a group of {len(nodes)} nodes exceeds {MAX_GROUP_NODES}"
    return None
