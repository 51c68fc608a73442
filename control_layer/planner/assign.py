"""From a unit-level solution to concrete tasks, dp ranks in ring order, and the sync topology."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from control_layer.planner import cost_model as cm
from control_layer.planner.fleet import Pool
from control_layer.planner.plan_types import PlannedTask, SyncTopology, laid_out_tasks
from control_layer.planner.problem import Problem, Solution
from control_layer.planner.quality import quality
from control_layer.planner.replicas import Replica, device_slots
from control_layer.planner.topology import cluster_gossip, order_ring

Device = tuple[Pool, str, int]  # pool, node id, device index


@dataclass
class _Group:
    """Replicas that form one sync participant: a cluster's pool."""

    region: str
    leader: str  # cluster id
    replicas: list[list[Device]]  # per replica: devices in (stage, tp rank) order


def _pool_replicas(pool: Pool, k: int, tp: int, pp: int) -> list[list[Device]]:
    """The first k replica slots of a pool: each replica whole on one node (the runtime's torchrun
    groups do not span nodes), nodes in order."""
    per = tp * pp
    slots: list[list[Device]] = []
    for node, ix in pool.nodes:
        whole = (len(ix) // per) * per
        slots += [[(pool, node, d) for d in ix[j : j + per]] for j in range(0, whole, per)]
        if len(slots) >= k:
            return slots[:k]
    raise ValueError(f"pool {pool.cluster.id}/{pool.model} cannot host {k} replicas")


def _groups(pr: Problem, sol: Solution) -> list[_Group]:
    tp, pp = pr.deg.tp, pr.deg.pp
    groups: list[_Group] = []
    # The units the solution uses, ascending (every unit where its maker did not name them).
    for u in range(len(pr.units)) if sol.units is None else sol.units:
        n1, n2, x2 = sol.n1[u], sol.n2[u], sol.x2[u]
        if not (n1 or n2):
            continue  # no replica here
        unit = pr.units[u]
        counts: list[int] = []
        if n2:
            base, extra = divmod(x2, n2)
            counts += [base + (1 if i < extra else 0) for i in range(n2)]
        counts += [1] * n1
        for pool, k in zip(unit.pools, counts, strict=False):
            groups.append(_Group(pool.region, pool.cluster.id, _pool_replicas(pool, k, tp, pp)))
    return groups


@dataclass
class Assignment:
    tasks: list[PlannedTask]
    replicas_per_cluster: dict[str, int]
    sync: SyncTopology
    regions: list[str]
    replicas: list[Replica]  # what the tasks say, per dp rank, for pricing them


def assign(pr: Problem, sol: Solution) -> Assignment:
    spec = pr.fleet.spec
    tp = pr.deg.tp
    links = pr.fleet.links
    groups = _groups(pr, sol)
    regions = sorted({g.region for g in groups})
    region_ring = order_ring(regions, links.bw, links.lat)
    pos = {r: i for i, r in enumerate(region_ring)}
    groups.sort(key=lambda g: (pos[g.region], g.leader, g.replicas[0][0][1], g.replicas[0][0][2]))

    rows: list[dict] = []
    replicas: list[Replica] = []
    per_cluster: dict[str, int] = defaultdict(int)
    slots = device_slots(pr.fleet.snapshot)
    for g in groups:
        for rep in g.replicas:
            rank = len(replicas)
            pool = rep[0][0]  # a replica sits on one node of one pool
            cid, node, region = pool.cluster.id, rep[0][1], pool.region
            on_node = slots[(cid, node)]
            rows += [
                {
                    "dp_rank": rank,
                    "pp_stage": i // tp,
                    "tp_rank": i % tp,
                    "cluster": cid,
                    "node": node,
                    "device": dev,
                    "region": region,
                }
                for i, (_, _, dev) in enumerate(rep)
            ]
            replicas.append(
                Replica(rank, [(pool.cluster, on_node[dev]) for _, _, dev in rep], (cid, node, pool.model))
            )
            per_cluster[cid] += 1

    tasks = laid_out_tasks(rows)  # built here from the snapshot's own figures
    ring = list(dict.fromkeys(g.leader for g in groups))
    gossip: dict[str, list[str]] = {}
    if spec.sync.mode == "gossip":
        region_of = {g.leader: g.region for g in groups}
        gossip = cluster_gossip(ring, region_of.__getitem__, region_ring, spec.sync.gossip_peers, links.bw)
    every = cm.sync_every(spec.sync)
    q = quality(spec.sync.mode, every, spec.sync.compression)
    topology = SyncTopology(
        mode=spec.sync.mode,
        ring=ring,
        gossip=gossip,
        compression=spec.sync.compression,
        every=every,
        loss_ratio=None if q is None else q.loss_ratio,
        loss_ratio_basis="" if q is None else q.measured_as,
    )
    return Assignment(tasks, dict(sorted(per_cluster.items())), topology, region_ring, replicas)
