"""simulate(): one training iteration of a placed plan, event by event.

What runs (the worker, ``training.runtime``; ``control_layer.worker_config``): each node's
replicas form one torchrun group (one task per node; a replica never spans nodes there, and nodes
that a hand-made placement's replica spans join one group here). Within a group every replica runs
its pipeline schedule; when a stage has finished its last backward on every replica of the group,
the replicas' copies of that stage (one ring per tp rank, over the devices holding it) all-reduce
their gradients (DDP; ZeRO-1/2 reduce-scatter then all-gather, the same ring volume; ZeRO-3 adds
one more all-gather, 3(n-1)/n instead of 2(n-1)/n). The iteration ends when the last ring ends.
Across groups, even two nodes of one cluster, the group leaders (replica 0's first device)
exchange the whole model over their links per ``sync.mode`` (``training.sync``: every node is a
participant of its own): sync, local SGD and DiLoCo a ring all-reduce (``DenseReducer``; top-k
too, each hop re-encodes its chunk), ssp a push of the update to every peer at once
(``StaleSync``), async a call to the parameter server per participant, update up and parameters
back (``AsyncServer``), gossip one round to the plan's peers; where the plan's exchange is
hierarchical, each region's participants push to its head, the heads ring and answer their
members. Where a dense mode's groups have their stages on several nodes
(``training.sync.stages``), each group's leader of stage s (its first replica's device of tp rank
0 in that stage) instead rings with the other groups' leaders of stage s over their own links,
moving only that stage's parameters, every stage's ring at once on one network (flows through one
port or link share it max-min). That exchange is simulated on its own and reported as an amortised
share per step, less what the steps beside it cover where the mode overlaps it.

Left out: overlap of gradient buckets with the backward pass, the optimizer step, data loading.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from benchmarks.sim.collectives import all_reduce, exchange
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
    call_s: float = 0.0,
    param_s: float = 0.0,
    fixed_s: float = 0.0,
) -> SimResult:
    """One iteration of ``option``. ``call_s``: the fixed seconds of one call of the sync
    transport beyond its bytes and latencies (``collectives``); ``param_s``: the leaders' work
    per parameter of a cross-group exchange (gathering the replica's tensors, encoding, decoding,
    the mean, scattering the result), once per exchange; ``fixed_s``: the fixed seconds of one
    exchange whatever its size (the per-tensor loop, fingerprints, waking its threads). All are
    inputs, like the goodputs."""
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

    exchange_s, wan_bytes = _cross_group(
        topo, spec, option, work, replicas, members, call_s, param_s, fixed_s
    )
    steps, every = spec.training.steps, option.sync.every if option.sync.mode in PERIODIC else 1
    per_step = math.ceil(steps / every) / steps
    mode = option.sync.mode
    overlapped = option.runtime is not None and option.runtime.overlap
    if (mode in ("diloco", "async") and overlapped) or (mode == "ssp" and spec.sync.staleness > 0):
        # The exchange runs beside the next round's steps and blocks only for what they do not
        # cover: overlapped DiLoCo applies a round at most a round after sending it; async takes
        # the server's answer at the next round's start; ssp's sender thread per peer pushes one
        # round after the other, so a round lasts at least its push (staleness bounds only how
        # many rounds may be queued).
        wan = per_step * max(0.0, exchange_s - every * iteration)
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


def _sync_key(d: Device, region: str, cluster_name: str, count_region: int, count_cluster: int) -> str:
    """The participant's name, as the control plane names it (``worker_config.sync_keys``)."""
    if count_region == 1:
        return region
    if count_cluster == 1:
        return f"{region}/{cluster_name}"
    return f"{region}/{cluster_name}/{d.node[:8]}"


def _parameter_server(topo: Topology, leaders: dict[str, Device]) -> str:
    """The group whose leader serves ``async``: the lowest-named participant (``AsyncServer``:
    ``ps_region`` unset, so ``sorted(regions)[0]``)."""
    names = {c.id: c.name or c.id for c in topo.snapshot.clusters}
    regions = [topo.region(d.cluster) for d in leaders.values()]
    clusters = [(topo.region(d.cluster), d.cluster) for d in leaders.values()]
    keys = {
        g: _sync_key(
            d,
            topo.region(d.cluster),
            names[d.cluster],
            regions.count(topo.region(d.cluster)),
            clusters.count((topo.region(d.cluster), d.cluster)),
        )
        for g, d in leaders.items()
    }
    return min(keys, key=lambda g: keys[g])


def _request_reply(
    net: Network, route, ps: Device, workers: list[Device], up: float, down: float, call_s: float
) -> None:
    """``async``: every worker sends its update to the server and, once it has arrived, gets the
    server's parameters back (one unary call each, all at once; the answer ends the call)."""
    for w in workers:

        def reply(w: Device = w) -> None:
            path, latency, label = route(ps, w)
            net.send(path, down, latency, lambda: net.at(call_s, lambda: None), label)

        path, latency, label = route(w, ps)
        net.send(path, up, latency, reply, label)


def _cross_group(
    topo: Topology,
    spec: JobSpec,
    option: PlanOption,
    work: Workload,
    replicas: dict[int, list[list[Device]]],
    members: dict[str, list[int]],
    call_s: float,
    param_s: float,
    fixed_s: float,
) -> tuple[float, dict[str, float]]:
    """One exchange between group leaders, on an otherwise idle network, as each mode's strategy
    moves its bytes (``training.sync``)."""
    if len(members) < 2:
        return 0.0, {}
    comp = option.sync.compression
    per_param = 8.0 * spec.sync.topk_ratio if comp == "topk" else WIRE_BYTES[comp]
    staged = _stage_rings(option, replicas, members)
    if staged:
        # Every stage's ring at once on one network: rings crossing one port or link share it.
        net = Network(topo.capacity)
        for s, leader in enumerate(staged):
            peers = [leader[g] for g in _ring(option, leader)]
            payload = work.stage_params[s] * per_param
            if len(peers) == 2:  # ``DenseReducer._all_to_all``: each pushes to the other
                exchange(
                    net,
                    topo.route,
                    [(a, b) for a in peers for b in peers if a != b],
                    payload,
                    lambda: None,
                    call_s,
                )
            else:
                all_reduce(net, topo.route, peers, payload, lambda: None, call_s).start()
        # Each stage's leader works on its own stage's parameters beside the others.
        return net.run() + max(work.stage_params) * param_s + fixed_s, dict(net.bytes_on)
    leader = {g: replicas[min(rs)][0][0] for g, rs in members.items()}
    # The plan's ring names clusters; the runtime orders a cluster's nodes after one another.
    order = [g for c in option.sync.ring for g in sorted(leader) if g.split("/")[0] == c]
    order = list(dict.fromkeys(order + sorted(leader)))
    peers = [leader[g] for g in order]
    update = work.n_params * per_param
    # Parameters travel in fp32, or bf16 when compression is on (``Strategy.param_codec``).
    params = work.n_params * (4.0 if comp in ("none", "fp32") else 2.0)
    net = Network(topo.capacity)
    mode = option.sync.mode
    if mode == "gossip":
        edges = []
        for c, peers_of in sorted(option.sync.gossip.items()):
            for p in peers_of:
                for a in (g for g in sorted(leader) if g.split("/")[0] == c):
                    for b in (g for g in sorted(leader) if g.split("/")[0] == p):
                        if a != b:
                            edges.append((leader[a], leader[b]))
        if not edges:  # no graph shipped: the ring's neighbours
            edges = [(peers[i], peers[(i + 1) % len(peers)]) for i in range(len(peers))]
        exchange(net, topo.route, edges, update, lambda: None, call_s)
    elif mode == "async":
        ps = _parameter_server(topo, leader)
        workers = [leader[g] for g in order if g != ps]
        _request_reply(net, topo.route, leader[ps], workers, update, params, call_s)
    elif option.sync.hierarchical and mode in STAGE_RING_MODES:
        _hierarchical(net, topo, peers, update, call_s)
    elif mode == "ssp" or len(peers) == 2:
        # ``StaleSync``: every participant pushes its update to every peer, one sender per peer;
        # ``DenseReducer`` does the same with two participants (``_all_to_all``).
        pairs = [(a, b) for a in peers for b in peers if a != b]
        exchange(net, topo.route, pairs, update, lambda: None, call_s)
    else:
        # ``DenseReducer``: a ring over three or more. Top-k stays top-k on the wire: every hop
        # re-encodes its chunk (``_ring``: ``ef.compress`` per hop), so the ring moves 2(P-1)/P
        # of the top-k payload like any other codec.
        all_reduce(net, topo.route, peers, update, lambda: None, call_s).start()
    # The leaders' work on every parameter and the exchange's fixed work: before the first byte
    # leaves and after the last arrives (an exchange on an idle network: where it falls does not
    # change its length).
    return net.run() + work.n_params * param_s + fixed_s, dict(net.bytes_on)


def _hierarchical(net: Network, topo: Topology, peers: list[Device], update: float, call_s: float) -> None:
    """``DenseReducer._hierarchical``: every participant pushes its update to its region's head
    (the region's first in ring order), the heads run the ring (also two of them), and each head
    pushes the averaged chunks, a payload's worth, back to its members. Each head starts its ring
    once its members' updates are in and answers its members once its ring is done."""
    regions: dict[str, list[Device]] = {}
    for d in peers:
        regions.setdefault(topo.region(d.cluster), []).append(d)
    heads = [ds[0] for ds in regions.values()]
    waiting = [len(regions)]

    def down() -> None:
        edges = [(ds[0], m) for ds in regions.values() for m in ds[1:]]
        exchange(net, topo.route, edges, update, lambda: None, call_s)

    def gathered() -> None:
        waiting[0] -= 1
        if waiting[0] == 0:
            all_reduce(net, topo.route, heads, update, down, call_s).start()

    for ds in regions.values():
        exchange(net, topo.route, [(m, ds[0]) for m in ds[1:]], update, gathered, call_s)


# Modes whose groups reduce stage by stage where a group's stages sit on several nodes
# (``training.sync.stages``): the dense ones.
STAGE_RING_MODES = ("sync", "local_sgd", "diloco")


def _stage_rings(
    option: PlanOption, replicas: dict[int, list[list[Device]]], members: dict[str, list[int]]
) -> list[dict[str, Device]]:
    """Per stage, each group's leader of it (the group's first replica's device of tensor rank 0
    in that stage), where the groups sync per stage: a dense mode, two or more groups, and a group
    whose stages' leaders are on different nodes. Empty otherwise (one leader per group)."""
    if option.sync.mode not in STAGE_RING_MODES or option.pp < 2:
        return []
    rings = [{g: replicas[min(rs)][s][0] for g, rs in members.items()} for s in range(option.pp)]
    split = any(len({_node(ring[g]) for ring in rings}) > 1 for g in members)
    return rings if split else []


def _ring(option: PlanOption, leader: dict[str, Device]) -> list[str]:
    """The groups in ring order: the plan's clusters in order, a cluster's leaders by group."""
    order = [g for c in option.sync.ring for g in sorted(leader) if leader[g].cluster == c]
    return list(dict.fromkeys(order + sorted(leader)))
