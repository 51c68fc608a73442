"""simulate(): one training iteration of a placed plan, event by event.

What runs (the worker, ``training.runtime``; ``control_layer.worker_config``): each node's
replicas form one torchrun group (one task per node; a replica never spans nodes there, and nodes
that a hand-made placement's replica spans join one group here). Within a group every replica runs
its pipeline schedule; when a stage has finished its last backward on every replica of the group,
the replicas' copies of that stage (one ring per tp rank, over the devices holding it) all-reduce their
gradients (DDP; ZeRO-1/2 reduce-scatter then all-gather, the same ring volume; ZeRO-3 adds one
more all-gather, 3(n-1)/n instead of 2(n-1)/n). The iteration ends when the last ring ends.
Across groups, even two nodes of one cluster, the group leaders (replica 0's first device) exchange
the whole model over their links per ``sync.mode`` (``training.sync``: every node is a participant
of its own): a dense ring all-reduce, an all-gather for top-k (sparse
vectors do not stay sparse under summation) or one gossip round to the plan's peers. That exchange
is simulated on its own and reported as an amortised share per step.

Left out: overlap of gradient buckets with the backward pass, the optimizer step, data loading,
the leader's gather and scatter of the whole model around a cross-group exchange.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from benchmarks.sim.collectives import all_gather, all_reduce, exchange
from benchmarks.sim.links import Device, Topology
from benchmarks.sim.network import Network
from benchmarks.sim.schedule import Pipeline, StageTimes
from benchmarks.sim.workload import Workload, workload
from contracts.job_spec import JobSpec
from control_layer.planner.plan_types import PlanOption
from control_layer.planner.snapshot import ResourceSnapshot

# bytes per parameter on the wire (training.compression.codecs): fp32 4; fp16/bf16 2; int8 one
# byte plus a float32 scale per int8_block (2048) elements; top-k a float32 value and an int32 index
WIRE_BYTES = {"none": 4.0, "fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "int8": 1.0 + 4.0 / 2048}
# exchange every sync.every steps (training.sync.strategies: ssp and async send their update at
# each round's start too); sync every step
PERIODIC = ("local_sgd", "diloco", "gossip", "ssp", "async")


@dataclass
class SimResult:
    step_s: float  # iteration + amortised blocking cross-group sync
    iteration_s: float
    compute_s: float  # on the busiest stage
    tp_comm_s: float  # on the busiest stage
    bubble_s: float  # pipeline idle with instantaneous transfers
    pp_comm_s: float  # what stage-to-stage transfers add to the pipeline
    dp_sync_s: float  # from the last backward to the last gradient ring's end
    wan_sync_s: float  # amortised per step, the part that blocks training
    wan_exchange_s: float  # one cross-group exchange on its own
    link_bytes: dict[str, float] = field(default_factory=dict)  # per iteration
    wan_link_bytes: dict[str, float] = field(default_factory=dict)  # per exchange


class _Groups:
    """Union-find over nodes: a replica spanning nodes joins them into one torchrun group."""

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, c: str) -> str:
        self.parent.setdefault(c, c)
        while self.parent[c] != c:
            self.parent[c] = self.parent[self.parent[c]]
            c = self.parent[c]
        return c

    def join(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def _node(d: Device) -> str:
    return f"{d.cluster}/{d.node}"


def _ring_time(topo: Topology, peers: list[Device], nbytes: float) -> float:
    net = Network(topo.capacity)
    all_reduce(net, topo.route, peers, nbytes, lambda: None).start()
    return net.run()


def simulate(
    spec: JobSpec,
    option: PlanOption,
    snapshot: ResourceSnapshot,
    efficiency: float = 0.5,
    lan_goodput: float = 1.0,
    wan_goodput: float = 1.0,
) -> SimResult:
    # The worker trains at the option's precision (a spec's "auto" resolves per option).
    if spec.training.precision != option.precision:
        training = spec.training.model_copy(update={"precision": option.precision})
        spec = spec.model_copy(update={"training": training})
    topo = Topology(snapshot, lan_goodput, wan_goodput)
    work = workload(spec, option.pp, option.tp, option.micro_batch_size)
    m = option.n_micro_batches
    tflops = {
        Device(c.id, n.id, d.index): d.tflops for c in snapshot.clusters for n in c.nodes for d in n.devices
    }

    grid: dict[int, list[list[Device | None]]] = {}
    for t in option.tasks:
        rows = grid.setdefault(t.dp_rank, [[None] * option.tp for _ in range(option.pp)])
        rows[t.pp_stage][t.tp_rank] = Device(t.cluster, t.node, t.device)
    replicas: dict[int, list[list[Device]]] = {}
    for r, rows in sorted(grid.items()):
        if any(d is None for row in rows for d in row):
            raise ValueError(f"replica {r} is missing a (stage, tp rank) task")
        replicas[r] = [[d for d in row if d is not None] for row in rows]

    groups = _Groups()
    for rows in replicas.values():
        nodes = sorted({_node(d) for row in rows for d in row})
        for n in nodes[1:]:
            groups.join(nodes[0], n)
    members: dict[str, list[int]] = {}
    for r, rows in replicas.items():
        members.setdefault(groups.find(_node(rows[0][0])), []).append(r)

    times = {r: _stage_times(topo, work, rows, tflops, efficiency) for r, rows in replicas.items()}
    iteration, t_pipe, link_bytes = _run(topo, work, option, replicas, members, times, m, False)
    _, t_bare, _ = _run(topo, work, option, replicas, members, times, m, True)

    busiest = max(
        ((r, s) for r in replicas for s in range(option.pp)),
        key=lambda rs: times[rs[0]][rs[1]].fwd + times[rs[0]][rs[1]].bwd,
    )
    st = times[busiest[0]][busiest[1]]
    busy, compute = m * (st.fwd + st.bwd), m * (st.fwd_compute + st.bwd_compute)
    pp_comm = max(0.0, t_pipe - t_bare)

    exchange_s, wan_bytes = _cross_group(topo, spec, option, work, replicas, members)
    steps, every = spec.training.steps, option.sync.every if option.sync.mode in PERIODIC else 1
    per_step = math.ceil(steps / every) / steps
    mode = option.sync.mode
    if mode == "diloco" or mode == "async" or (mode == "ssp" and spec.sync.staleness > 0):
        # the exchange runs while training goes on for the next round (diloco), or `staleness` steps
        window = every if mode == "diloco" else max(1, spec.sync.staleness if mode == "ssp" else 1)
        wan = per_step * max(0.0, exchange_s - window * iteration)
    else:
        wan = per_step * exchange_s
    return SimResult(
        step_s=iteration + wan,
        iteration_s=iteration,
        compute_s=compute,
        tp_comm_s=busy - compute,
        bubble_s=max(0.0, t_bare - busy),
        pp_comm_s=pp_comm,
        dp_sync_s=max(0.0, iteration - t_pipe),
        wan_sync_s=wan,
        wan_exchange_s=exchange_s,
        link_bytes=link_bytes,
        wan_link_bytes=wan_bytes,
    )


def _stage_times(
    topo: Topology, work: Workload, rows: list[list[Device]], tflops: dict[Device, float], eff: float
) -> list[StageTimes]:
    out = []
    for s, devs in enumerate(rows):
        w = work.stages[s]
        rate = min(tflops[d] for d in devs) * 1e12 * eff
        ar = _ring_time(topo, sorted(devs), work.tp_bytes) if len(devs) > 1 else 0.0
        f, b = w.fwd_flops / rate, w.bwd_flops / rate
        out.append(StageTimes(f + w.tp_allreduces_fwd * ar, b + w.tp_allreduces_bwd * ar, f, b))
    return out


def _run(
    topo: Topology,
    work: Workload,
    option: PlanOption,
    replicas: dict[int, list[list[Device]]],
    members: dict[str, list[int]],
    times: dict[int, list[StageTimes]],
    m: int,
    bare: bool,
) -> tuple[float, float, dict[str, float]]:
    """(iteration end, last backward end, bytes per link); ``bare``: free transfers, no gradient sync."""
    net = Network(topo.capacity)
    grad_factor = 1.5 if option.zero == 3 else 1.0
    pending: dict[tuple[str, int], int] = {
        (g, s): len(rs) for g, rs in members.items() for s in range(option.pp)
    }
    group_of = {r: g for g, rs in members.items() for r in rs}

    def stage_done(r: int, s: int) -> None:
        key = (group_of[r], s)
        pending[key] -= 1
        if pending[key] or bare or len(members[key[0]]) < 2:
            return
        for t in range(option.tp):
            peers = sorted(replicas[q][s][t] for q in members[key[0]])
            all_reduce(net, topo.route, peers, work.stages[s].grad_bytes * grad_factor, lambda: None).start()

    pipes = []
    for r, rows in replicas.items():
        p = Pipeline(
            net,
            topo.route,
            rows,
            times[r],
            option.pp_schedule,
            m,
            work.activation_bytes,
            on_stage_done=lambda s, r=r: stage_done(r, s),
            free_links=bare,
        )
        p.start()
        pipes.append(p)
    end = net.run()
    return end, max(max(p.done_at) for p in pipes), dict(net.bytes_on)


def _cross_group(
    topo: Topology,
    spec: JobSpec,
    option: PlanOption,
    work: Workload,
    replicas: dict[int, list[list[Device]]],
    members: dict[str, list[int]],
) -> tuple[float, dict[str, float]]:
    """One exchange between group leaders, on an otherwise idle network."""
    if len(members) < 2:
        return 0.0, {}
    leader = {g: replicas[min(rs)][0][0] for g, rs in members.items()}
    # The plan's ring names clusters; the runtime orders a cluster's nodes after one another.
    order = [g for c in option.sync.ring for g in sorted(leader) if g.split("/")[0] == c]
    order = list(dict.fromkeys(order + sorted(leader)))
    peers = [leader[g] for g in order]
    comp = option.sync.compression
    per_param = 8.0 * spec.sync.topk_ratio if comp == "topk" else WIRE_BYTES[comp]
    payload = work.n_params * per_param
    net = Network(topo.capacity)
    if option.sync.mode == "gossip":
        edges = []
        for c, peers_of in sorted(option.sync.gossip.items()):
            for p in peers_of:
                for a in (g for g in sorted(leader) if g.split("/")[0] == c):
                    for b in (g for g in sorted(leader) if g.split("/")[0] == p):
                        if a != b:
                            edges.append((leader[a], leader[b]))
        if not edges:  # no graph shipped: the ring's neighbours
            edges = [(peers[i], peers[(i + 1) % len(peers)]) for i in range(len(peers))]
        exchange(net, topo.route, edges, payload, lambda: None)
    elif comp == "topk":
        all_gather(net, topo.route, peers, payload, lambda: None).start()
    else:
        all_reduce(net, topo.route, peers, payload, lambda: None).start()
    return net.run(), dict(net.bytes_on)
