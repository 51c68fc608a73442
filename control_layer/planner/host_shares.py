"""How many times slower than on an idle core a plan's CPU slots run on their hosts: the host
share σ (docs/cost-model.md, "Host share σ")."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from control_layer.planner import cost_model as cm
from control_layer.planner.plan_types import PlannedTask
from control_layer.planner.replicas import Replica
from control_layer.planner.snapshot import ResourceSnapshot


@dataclass(frozen=True)
class _Hosts:
    """Per host of a snapshot, what its CPU slots' share depends on (built once per snapshot)."""

    host_of: dict[str, str]  # node id -> host
    cores: dict[str, int]  # host -> physical cores (0: unknown)
    others: dict[str, float]  # host -> runnable threads there now besides a plan's, from contention
    busy: dict[str, int]  # host -> CPU slots busy with other jobs
    measured_under: dict[str, float]  # node id -> contention it measured its profile under


def others_now(contention: float, cores: int, busy_then: float | None, busy_now: int) -> float:
    """Runnable threads on a host now besides a new plan's, from one agent's contention figure c
    (runnable threads per core, its probe's own thread included): c·cores − 1 when it was
    measured, plus the CPU slots of other jobs busy now. An agent that can tell cpn's own
    processes apart leaves them out of c (``agent.cpn_threads``) and sends no probe instants
    (``busy_then`` None): c is what cpn does not place. One that cannot sends the instants, and
    the slots of other jobs busy then (``busy_then``, counted by the resource layer) are taken
    out instead, so a figure taken beside a job that has since ended (or before one that has
    since started) prices the host as it is."""
    measured = max(0.0, contention * cores - 1.0)
    return max(0.0, measured - (busy_then or 0.0)) + busy_now


def _hosts(snapshot: ResourceSnapshot) -> _Hosts:
    cores: dict[str, int] = {}
    busy: dict[str, int] = defaultdict(int)
    measured_under: dict[str, float] = {}
    host_of: dict[str, str] = {}
    figures: list[tuple[str, float, float | None]] = []  # (host, contention, busy at its probes)
    for c in snapshot.clusters:
        for n in c.nodes:
            host = n.host
            host_of[n.id] = host
            if n.profile and n.profile.physical_cores:
                cores[host] = max(cores.get(host, 0), n.profile.physical_cores)
                measured_under[n.id] = n.profile.host_load_factor
            if n.cpu_contention is not None:
                figures.append((host, n.cpu_contention, n.cpu_contention_busy))
            busy[host] += sum(d.kind == "cpu" and not d.free for d in n.devices)
    others: dict[str, float] = {}
    for host, contention, busy_then in figures:
        if n_cores := cores.get(host, 0):
            # On a host shared by several agents, the quietest figure saw the least of what
            # the control plane does not know of.
            o = others_now(contention, n_cores, busy_then, busy.get(host, 0))
            others[host] = min(others.get(host, math.inf), o)
    return _Hosts(host_of, cores, others, dict(busy), measured_under)


def host_shares(
    snapshot: ResourceSnapshot, tasks: Sequence[PlannedTask], one_per_node: bool = False
) -> dict[str, float]:
    """Per node of the plan: how many times slower than on an idle core its CPU slots run, start
    and stop. One-thread slots take turns on the host's physical cores with everything else that
    runs there. Where heartbeats report the host's contention c (runnable threads per core, a new
    one included, cpn's own left out: c·cores − 1 others, none on an idle host; plus the other
    jobs' slots busy now: ``others_now``), the plan's k slots make it
    (others + k) / cores, at least 1;
    with none reported, other jobs' busy slots stand in for the others and the factor is at least
    the contention the host measured under at registration. Several agents may share one host
    (``NodeInfo.host``). 1 on CUDA nodes and where the cores are unknown. ``one_per_node``: the
    plan runs one process per node with CPU slots instead of one per slot (the launcher before
    the workers start)."""
    nodes = snapshot.nodes_by_id()
    kinds: dict[str, dict[int, str]] = {}
    cpu_slots: dict[str, int] = defaultdict(int)  # node id -> the plan's CPU slots there
    for t in tasks:
        node = nodes.get(t.node)
        if node is None:
            continue
        if t.node not in kinds:
            kinds[t.node] = {d.index: d.kind for d in node.devices}
        cpu_slots[t.node] += kinds[t.node].get(t.device) == "cpu"
    out = {t.node: 1.0 for t in tasks}
    if not any(cpu_slots.values()):
        return out
    if one_per_node:
        cpu_slots = defaultdict(int, {n: min(1, k) for n, k in cpu_slots.items()})
    hosts = snapshot.derived("hosts", _hosts)
    plan: dict[str, int] = defaultdict(int)
    for node_id, k in cpu_slots.items():
        plan[hosts.host_of.get(node_id, node_id)] += k
    for node_id in out:
        host = hosts.host_of.get(node_id, node_id)
        n_cores = hosts.cores.get(host, 0)
        if not plan[host] or not n_cores:
            continue
        if host in hosts.others:
            out[node_id] = cm.host_share(hosts.others[host] + plan[host], n_cores)
        else:
            share = cm.host_share(hosts.busy.get(host, 0) + plan[host], n_cores)
            out[node_id] = max(share, hosts.measured_under.get(node_id, 0.0), 1.0)
    return out


def shares_of(
    snapshot: ResourceSnapshot,
    tasks: Sequence[PlannedTask],
    replicas: Sequence[Replica],
    one_per_node: bool = False,
) -> dict[str, float]:
    """``host_shares``, without a pass over the tasks where no CPU slot is planned (all 1)."""
    if any(s.kind == "cpu" for rep in replicas for _, s in rep.devices):
        return host_shares(snapshot, tasks, one_per_node)
    return dict.fromkeys((n for rep in replicas for n in rep.all_nodes), 1.0)
