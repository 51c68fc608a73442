"""Per-task worker configuration: a plan option cut into one ``WorkerConfig`` per node.

Pure: (spec, option, the placed tasks) -> JSON-able dicts. Each node runs its share with
torchrun. Nodes whose replicas cross them (``control_layer.planner.node_groups``) form one torchrun group,
each node its block of ranks; any other node is a group of its own. A group's replicas are its
data-parallel group, and its leader (node rank 0, rank 0) talks to the leaders of every other
group over the WAN (``sync.listen`` / ``sync.peers``). Where a group's pipeline stages have their
leaders on different nodes and the mode is dense (``node_groups.per_stage_sync``), every group's
leader of each stage (the stage's first rank) meets the same stage of the other groups in a ring of
its own instead (``sync.stages``), listening on a port of its node's sync range.
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import re
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from contracts.errors import FailedPrecondition
from contracts.feasibility import (
    batch_problems,
    byo_problems,
    data_region_problems,
    shape_problems,
    sync_port_problems,
)
from contracts.job_spec import JobSpec
from contracts.sync_config import OVERLAPPED_MODES
from contracts.worker_config import MAX_TIME_LIMIT_S
from control_layer.planner.node_groups import (
    node_group_problems,
    node_groups,
    per_stage_sync,
    rank_key,
    stage_leader_nodes,
)
from control_layer.planner.plan_types import PlannedTask, PlanOption, RuntimeSettings
from control_layer.planner.runtime_settings import runtime_settings
from control_layer.planner.sync_choice import pinned
from control_layer.stage_sections import JobStage

# A job's leaders write a metrics line at most once a second: a line a step woke the agent on the
# workers' own cores ~4 times a second (0.7-1 s of a 130 s, 500-step run on a 2-core host), and the
# control plane keeps only the latest each agent forwards anyway.
METRICS_INTERVAL_S = 1.0
# A scheduler's time limit for a task (``time_limit_s``, Slurm's ``--time``): the quote's
# pessimistic run (its interval's high end, without the staging and queue wait before it runs) times
# this margin, and never below the floor. A task past it is ended as TIMEOUT and resumes from its
# checkpoint elsewhere; the margin keeps that for runs the quote badly missed.
TIME_LIMIT_MARGIN = 2.0
MIN_TIME_LIMIT_S = 600.0


# A scheduler-backed node gives up on a task its queue has not started within the quote's wait
# plus this share of it plus the slack (a scheduler's cycle, a job ahead ending late), and the
# control plane re-places it elsewhere.
QUEUE_TOLERANCE = 0.5
QUEUE_SLACK_S = 120.0


def start_within_s(option: PlanOption) -> float:
    """How long a task of the option may wait in a scheduler's queue before it is re-placed."""
    wait = option.estimates.queue_wait_s or 0.0
    return round(min(MAX_TIME_LIMIT_S, wait * (1 + QUEUE_TOLERANCE) + QUEUE_SLACK_S), 1)


def quoted_time_limit_s(option: PlanOption) -> float:
    """The time limit a scheduler-backed node gives the option's tasks, from its quote."""
    est = option.estimates
    high = est.interval.duration_s_high if est.interval is not None else est.duration_s
    run_s = max(0.0, high - (est.staging_s or 0.0) - (est.queue_wait_s or 0.0))
    return round(min(MAX_TIME_LIMIT_S, max(MIN_TIME_LIMIT_S, TIME_LIMIT_MARGIN * run_s)), 1)


@dataclass(frozen=True)
class TaskSlot:
    """One node's share of an option, as placed: where its leader listens and what it runs."""

    node_id: str
    cluster_id: str
    cluster_name: str
    region: str
    host: str
    sync_port: int | None
    entries: tuple[PlannedTask, ...]
    # Node rank 0 of a group spanning nodes: where it hosts the group's rendezvous store.
    group_port: int | None = None
    # Where other clusters, of its region and of others, reach this node's torchrun endpoint,
    # when its agent declared one (``--cross-cluster-host``): it may share a group with nodes there.
    cross_cluster_host: str | None = None
    # Per-stage sync: a port of its sync range for each stage whose leader this node holds, in stage
    # order (the first is ``sync_port``).
    stage_ports: tuple[int, ...] = ()

    @property
    def dp_ranks(self) -> list[int]:
        return sorted({e.dp_rank for e in self.entries})

    @property
    def device_indices(self) -> list[int]:
        """Devices in the worker's rank order (stage, replica, tensor shard): torchrun's local ranks."""
        ordered = sorted(self.entries, key=rank_key)
        return [e.device for e in ordered]

    @property
    def listen(self) -> str | None:
        return f"{self.host}:{self.sync_port}" if self.sync_port else None


def group_by_node(option: PlanOption) -> dict[str, list[PlannedTask]]:
    groups: dict[str, list[PlannedTask]] = {}
    for entry in option.tasks:
        groups.setdefault(entry.node, []).append(entry)
    return groups


def option_problems(spec: JobSpec, option: PlanOption, reachable: Collection[str] = ()) -> list[str]:
    """Why the runtime could not run this option (``contracts.feasibility``), empty when it can;
    ``reachable``: the nodes that may share a group with other clusters' nodes."""
    model = spec.model
    problems = node_group_problems(option.tasks, reachable)
    per_replica = option.tp * option.pp
    counts = Counter(e.dp_rank for e in option.tasks)
    if any(n != per_replica for n in counts.values()) or len(counts) != option.dp:
        problems.append(
            f"expected {option.dp} replicas of {per_replica} devices, got {dict(sorted(counts.items()))}"
        )
    if spec.entrypoint is None:
        problems += shape_problems(
            n_heads=model.n_heads, n_layers=model.n_layers, d_model=model.d_model, tp=option.tp, pp=option.pp
        )
    problems += byo_problems(
        entrypoint=spec.entrypoint is not None,
        supports=spec.byo_parallelism,
        tp=option.tp,
        pp=option.pp,
        zero=option.zero,
        activation_checkpointing=option.activation_checkpointing,
    )
    problems += batch_problems(
        global_batch=spec.global_batch_sequences,
        dp=option.dp,
        micro_batch=option.micro_batch_size,
        pp=option.pp,
    )
    problems += data_region_problems(spec.data.region, [e.region for e in option.tasks if e.region])
    return problems


def check_node_groups(option: PlanOption, spec: JobSpec, reachable: Collection[str] = ()) -> None:
    """Refuse an option the runtime cannot run: node groups it can launch (one cluster, or clusters
    of any regions whose nodes are all ``reachable``; a block of ranks per node), complete
    replicas, and the shape, batch and data-region rules."""
    problems = option_problems(spec, option, reachable)
    if problems:
        raise FailedPrecondition(
            f"plan option {option.id}: {'; '.join(problems)}", option_id=option.id, problems=problems
        )


def sync_keys(slots: list[TaskSlot]) -> list[str]:
    """A participant name per task: its region when it is the job's only task there, else
    region/cluster, or region/cluster/node-id-prefix when one cluster holds several of its tasks."""
    regions = Counter(s.region for s in slots)
    clusters = Counter((s.region, s.cluster_name) for s in slots)
    keys = []
    for s in slots:
        if regions[s.region] == 1:
            keys.append(s.region)
        elif clusters[(s.region, s.cluster_name)] == 1:
            keys.append(f"{s.region}/{s.cluster_name}")
        else:
            keys.append(f"{s.region}/{s.cluster_name}/{s.node_id[:8]}")
    return keys


def job_sync_secret(server_secret: str, job_id: str) -> str:
    """The secret a job's leaders sign their sync calls with: stable across the job's attempts (a
    re-placed region rejoins the survivors), different for every job, known only to the control
    plane and the job's own tasks."""
    return hmac.new(server_secret.encode(), f"sync:{job_id}".encode(), hashlib.sha256).hexdigest()


def build_worker_configs(
    job_id: str,
    spec: JobSpec,
    option: PlanOption,
    slots: list[TaskSlot],
    *,
    sync_secret: str | None = None,
    checkpoints: dict[str, dict[str, Any]] | None = None,
    stage: JobStage | None = None,
) -> dict[str, dict[str, Any]]:
    """node_id -> WorkerConfig dict for every task of the option; with ``sync_secret`` the
    leaders accept sync calls only from each other. ``checkpoints`` are the job's latest complete
    checkpoints by participant key (``control_layer.checkpoints``): where a task has none of its
    own on its node but the job has peers to take the model from, it starts at their step.
    Sync settings the spec left to the planner are the option's (``sync_choice.pinned``).
    ``stage``: the job's code, data and outputs (``control_layer.stage_sections``): each task gets
    its region's section, and only the leader of the group holding replica 0 the output URLs."""
    spec = pinned(spec, option)
    check_node_groups(option, spec, [s.node_id for s in slots if s.cross_cluster_host])
    groups = slot_groups(option, slots)
    leaders = [g[0] for g in groups]
    keys = sync_keys(leaders)
    global_batch = spec.global_batch_sequences
    local_batch = global_batch // option.dp
    multi = len(leaders) > 1
    missing = [s.node_id for s in leaders if s.listen is None]
    problems = sync_port_problems(len(leaders), missing)
    problems += data_region_problems(spec.data.region, [s.region for s in slots])
    unported = [g[0].node_id for g in groups if len(g) > 1 and g[0].group_port is None]
    if unported:
        problems.append(f"nodes {unported} lead groups spanning nodes and have no port for their rendezvous")
    if problems:
        raise FailedPrecondition("; ".join(problems), nodes=missing + unported)
    gossip = _gossip_graph(option, leaders, keys)
    runtime = option.runtime or runtime_settings(spec, option)
    ring = _ring_order(option, leaders, keys)
    stage_rings = (
        _stage_rings(option, groups, keys) if per_stage_sync(option.tasks, spec.sync.mode, option.pp) else []
    )
    # The exchange the option was priced with: hierarchical only where its estimate chose it.
    hierarchy = _hierarchy(leaders, keys, ring) if option.sync.hierarchical and not stage_rings else {}

    configs: dict[str, dict[str, Any]] = {}
    offset = 0
    for group, leader, key in zip(groups, leaders, keys, strict=True):
        dp_local = len({r for s in group for r in s.dp_ranks})
        peers = {k: s.listen for s, k in zip(leaders, keys, strict=True) if s is not leader} if multi else {}
        shared = {
            "job_id": job_id,
            # The worker's region is its name among the job's sync participants (training.sync keys
            # peers by it): the region itself, unless the job has several groups there.
            "region": key,
            "cluster": leader.cluster_name,
            "model": _model(spec),
            "data": _data(spec, leader, key),
            "training": _training(spec, option, local_batch, global_batch),
            "parallel": {
                "dp_local": dp_local,
                "tp": option.tp,
                "pp": option.pp,
                "zero": option.zero,
                "pp_schedule": option.pp_schedule,
                "microbatches": option.n_micro_batches if option.pp > 1 else None,
            },
            "sync": (
                _sync(spec, option, leader, key, peers, offset, gossip)
                | _overlap(runtime, spec.sync.mode)
                # Without the server's secret the job's leaders get no TLS either (``allocation``):
                # the config says so, and the engine runs plaintext only because it is told to.
                | {"auth_secret": sync_secret, "ring_order": ring, "insecure": sync_secret is None}
                | ({"hierarchy": hierarchy} if hierarchy else {})
                if multi
                else _solo(option, offset)
            ),
            "entrypoint": spec.entrypoint,
            "metrics_interval_s": METRICS_INTERVAL_S,
            "time_limit_s": quoted_time_limit_s(option),
            "start_within_s": start_within_s(option),
        }
        members = {s.node_id for s in group}
        for node_rank, slot in enumerate(group):
            # A group spanning nodes resumes as one: every node from the participant's checkpoint
            # (each holds the whole of it, ``training.checkpoint_mirror``; a node without it
            # fetches it), all from one start step where none can be had.
            here = None if len(group) > 1 else slot.node_id
            ck = _checkpoint(
                job_id, key, here, runtime, checkpoints or {}, multi, spec.training.steps, spec.sync.mode
            )
            ck["fetch"] = _fetch_choice(
                (checkpoints or {}).get(key), slot.node_id, ck["resume_at_most"], members
            )
            configs[slot.node_id] = copy.deepcopy(shared) | {
                "checkpoint": ck,
                "group": _group(group, node_rank),
            }
            if stage is not None:
                final = offset == 0 and node_rank == 0  # holds replica 0: writes the final model
                configs[slot.node_id]["stage"] = stage.section(slot.region, final=final)
            if stage_rings:
                configs[slot.node_id]["sync"]["stages"] = _stage_section(stage_rings, key, slot)
        offset += dp_local
    return configs


@dataclass(frozen=True)
class StagePlan:
    """One stage's ring: each participant's leader of the stage (node and address) and the ring order."""

    stage: int
    leaders: dict[str, tuple[str, str]]  # participant key -> (node id, host:port)
    ring_order: list[str]


def _stage_rings(option: PlanOption, groups: list[list[TaskSlot]], keys: list[str]) -> list[StagePlan]:
    """Every stage's ring: where each group's leader of it listens (the next port of its node's
    ``stage_ports``, stages in order) and the ring order over those leaders' clusters."""
    problems, plans = [], []
    leaders_by_stage: list[dict[str, tuple[str, str]]] = [{} for _ in range(option.pp)]
    slots_by_stage: list[list[TaskSlot]] = [[] for _ in range(option.pp)]
    for group, key in zip(groups, keys, strict=True):
        by_node = {s.node_id: s for s in group}
        nodes = stage_leader_nodes(option.tasks, set(by_node))
        taken: Counter[str] = Counter()
        for stage, node in enumerate(nodes):
            slot = by_node[node]
            i = taken[node]
            taken[node] += 1
            if i >= len(slot.stage_ports):
                problems.append(f"node {node} leads stage {stage} of {key} and has no sync port for its ring")
                continue
            leaders_by_stage[stage][key] = (node, f"{slot.host}:{slot.stage_ports[i]}")
            slots_by_stage[stage].append(slot)
    if problems:
        raise FailedPrecondition("; ".join(problems), problems=problems)
    for stage in range(option.pp):
        stage_keys = list(leaders_by_stage[stage])
        ring = _ring_order(option, slots_by_stage[stage], stage_keys)
        plans.append(StagePlan(stage, leaders_by_stage[stage], ring))
    return plans


def _stage_section(plans: list[StagePlan], key: str, slot: TaskSlot) -> list[dict[str, Any]]:
    """contracts.sync_config.StageRing per stage, as ``slot``'s node sees it: it listens only for
    the stages whose leader it holds."""
    out = []
    for plan in plans:
        node, addr = plan.leaders[key]
        here = addr if node == slot.node_id else None
        out.append(
            {
                "stage": plan.stage,
                "listen": here,
                "advertise": here,
                "peers": {k: a for k, (_, a) in plan.leaders.items() if k != key},
                "ring_order": plan.ring_order,
            }
        )
    return out


def stage_port_counts(option: PlanOption, mode: str) -> dict[str, int]:
    """Per node, the ports its stage leaders' rings need (per-stage sync only, else empty)."""
    if not per_stage_sync(option.tasks, mode, option.pp):
        return {}
    counts: Counter[str] = Counter()
    for nodes in node_groups(option.tasks):
        counts.update(stage_leader_nodes(option.tasks, set(nodes)))
    return dict(counts)


def slot_groups(option: PlanOption, slots: list[TaskSlot]) -> list[list[TaskSlot]]:
    """The option's torchrun groups as slots, each in node-rank order (``node_groups``)."""
    by_node = {s.node_id: s for s in slots}
    unknown = sorted({e.node for e in option.tasks} - set(by_node))
    if unknown or len(by_node) != len(slots):
        raise FailedPrecondition(f"the placed tasks do not match the option's nodes (missing {unknown})")
    return [[by_node[n] for n in nodes] for nodes in node_groups(option.tasks)]


def _group(group: list[TaskSlot], node_rank: int) -> dict[str, Any] | None:
    """contracts.worker_config.NodeGroupSpec: where this node's share meets the group's others."""
    if len(group) == 1:
        return None
    head = group[0]
    # A group across clusters meets where the other clusters reach its head (checked: declared).
    across = len({s.cluster_id for s in group}) > 1
    return {
        "nnodes": len(group),
        "node_rank": node_rank,
        "master_addr": head.cross_cluster_host if across else head.host,
        "master_port": head.group_port,
    }


def _sync(
    spec: JobSpec,
    option: PlanOption,
    slot: TaskSlot,
    key: str,
    peers: dict[str, str | None],
    offset: int,
    gossip: dict[str, list[str]],
) -> dict[str, Any]:
    """contracts.sync_config.SyncConfig for a task that has peers: it is ``key`` among them."""
    s = spec.sync
    explicit = s.model_fields_set
    sync: dict[str, Any] = {
        "mode": s.mode,
        "every": s.every,
        "compression": s.compression,
        "topk_ratio": s.topk_ratio,
        "staleness": s.staleness,
        "gossip_peers": s.gossip_peers,
        "region": key,
        "listen": slot.listen,
        "advertise": slot.listen,
        "peers": peers,
        "global_replicas": option.dp,
        "replica_offset": offset,
    }
    # The spec's outer-optimizer defaults are DiLoCo's; other modes keep their own unless asked.
    if s.mode == "diloco" or "outer_lr" in explicit:
        sync["outer_lr"] = s.outer_lr
    if s.mode == "diloco" or "outer_momentum" in explicit:
        sync["outer_momentum"] = s.outer_momentum
    if s.mode == "gossip" and gossip:
        sync["gossip_graph"] = [gossip]
    if s.mode in ("local_sgd", "diloco"):
        # Regions of unequal speed (an A100 region beside an H100 one, or hosts shared unevenly)
        # reach every round's end together: each region's steps per round follow its speed, the
        # round's total stays the plan's (the planner prices the balanced round).
        sync["balance"] = True
    return sync


def _overlap(runtime: RuntimeSettings, mode: str) -> dict[str, Any]:
    """The planner's overlap and streaming choices for this mode (``planner.sync_settings``).
    Overlapped DiLoCo lands each round ``overlap_steps`` after sending it with the merge the
    planner chose for that delay (``contracts.sync_delay.overlap_merge_for``: the local progress
    kept on a short delay, Streaming DiLoCo's mix on a long one; mix where an option predates it)."""
    if not runtime.overlap:
        # Said where the mode's own default is to overlap (contracts.sync_config.OVERLAPPED_MODES).
        return {"overlap": False} if mode in OVERLAPPED_MODES else {}
    out: dict[str, Any] = {
        "overlap": True,
        "overlap_steps": runtime.overlap_steps,
        "fragments": runtime.fragments,
    }
    if mode == "diloco":
        out["overlap_merge"] = runtime.overlap_merge or "mix"
    return out


def checkpoint_dir(job_id: str, key: str) -> str:
    """Where a task keeps its checkpoints, relative to its agent's work dir: one directory per job
    and participant, so the task that replaces it on the same node finds them."""
    return f"checkpoints/{job_id}/{re.sub(r'[^A-Za-z0-9._-]', '_', key)}"


def _checkpoint(
    job_id: str,
    key: str,
    node_id: str | None,
    runtime: RuntimeSettings,
    checkpoints: dict[str, dict[str, Any]],
    multi: bool,
    steps: int,
    mode: str,
) -> dict[str, Any]:
    """contracts.worker_config.CheckpointSpec of participant ``key`` on node ``node_id`` (None: a
    group spanning nodes, whose start step must not depend on which node holds what); its
    ``fetch`` is the caller's (``_fetch_choice``)."""
    own = checkpoints.get(key)
    start_step = resume_at_most = None
    done = [int(c["step"]) for c in checkpoints.values() if isinstance(c.get("step"), int)]
    if multi and mode == "sync" and done:
        # Lockstep regions must resume at one step: the earliest any region completed (a region
        # may have finished a later one before the job paused). One without a checkpoint there
        # takes the others' model at that step.
        start_step = resume_at_most = min(done)
    elif multi and not (own and node_id is not None and own.get("node_id") == node_id):
        # No checkpoint of its own here: begin where the job's checkpoints are and take the
        # survivors' model at the first exchange (the engine catches a late joiner up).
        if own and isinstance(own.get("step"), int):
            start_step = int(own["step"])
        elif done:
            start_step = min(done)
    if start_step is not None and start_step >= steps:
        start_step = None  # nothing left to train: a fresh start is the only meaningful one
    return {
        "dir": checkpoint_dir(job_id, key),
        "every": runtime.checkpoint_every,
        "start_step": start_step,
        "resume_at_most": resume_at_most,
        "fetch": None,
    }


def _fetch_choice(
    own: dict[str, Any] | None, node_id: str, at_most: int | None, group: set[str]
) -> dict[str, Any] | None:
    """Where this node fetches the participant's checkpoint from before it launches: the newest
    step (at most ``at_most``) some other node holds, unless this node holds it already (its own
    checkpoint, or a copy that landed here). A holder in the node's own ``group`` comes first: it
    is placed in this attempt beside it, where another holder may be the node whose loss brought
    the re-placement, dead but not yet judged lost (its fetch would fail and the group would start
    from step 0). For the same reason a group spanning nodes resumes at the newest step one of its
    own nodes holds, where one holds any: a newer step only the dead node had (its copy to the
    survivor still under way) would fail to arrive, or leave the group no step in common.
    ``control_layer.checkpoint_copies`` signs the choice."""
    held = [
        (int(h["step"]), str(h["node_id"]))
        for h in (own or {}).get("holders") or []
        if at_most is None or int(h["step"]) <= at_most
    ]
    if not held:
        return None
    in_group = [s for s, n in held if n in group]
    best = max(in_group) if len(group) > 1 and in_group else max(s for s, _ in held)
    nodes = sorted((n for s, n in held if s == best), key=lambda n: (n not in group, n))
    if node_id in nodes:
        return None
    return {"step": best, "source_node_id": nodes[0]}


def _solo(option: PlanOption, offset: int) -> dict[str, Any]:
    """A job's only task has nobody to sync with."""
    return {"mode": "none", "peers": {}, "global_replicas": option.dp, "replica_offset": offset}


def _ring_order(option: PlanOption, slots: list[TaskSlot], keys: list[str]) -> list[str]:
    """The planner's ring of clusters, in task keys: the order dense modes reduce around."""
    by_cluster: dict[str, list[str]] = {}
    for slot, key in zip(slots, keys, strict=True):
        by_cluster.setdefault(slot.cluster_id, []).append(key)
    order = [k for cid in option.sync.ring for k in by_cluster.get(cid, [])]
    return order + [k for k in keys if k not in order]


def _hierarchy(slots: list[TaskSlot], keys: list[str], ring: list[str]) -> dict[str, list[str]]:
    """Region -> its participants in ring order (the first is the region's head), regions in the
    order the ring meets them: the heads' ring keeps the plan's order of regions."""
    region_of = {k: s.region for s, k in zip(slots, keys, strict=True)}
    out: dict[str, list[str]] = {}
    for k in ring:
        out.setdefault(region_of[k], []).append(k)
    return out


def _gossip_graph(option: PlanOption, slots: list[TaskSlot], keys: list[str]) -> dict[str, list[str]]:
    """The option's gossip graph between clusters, in task keys (a cluster's tasks share its peers)."""
    by_cluster: dict[str, list[str]] = {}
    for slot, key in zip(slots, keys, strict=True):
        by_cluster.setdefault(slot.cluster_id, []).append(key)
    graph: dict[str, list[str]] = {}
    for src, dsts in option.sync.gossip.items():
        for k in by_cluster.get(src, []):
            graph[k] = [d for dst in dsts for d in by_cluster.get(dst, []) if d != k]
    return graph


def _model(spec: JobSpec) -> dict[str, Any]:
    m = spec.model
    return {
        "n_layers": m.n_layers,
        "d_model": m.d_model,
        "n_heads": m.n_heads,
        "vocab": m.vocab,
        "seq_len": m.seq_len,
    }


def _data(spec: JobSpec, slot: TaskSlot, key: str) -> dict[str, Any]:
    d = spec.data
    # A source or shards: the agent stages the file and sets data.path to it (``stage.data``).
    return {
        # a bring-your-own entrypoint supplies its own dataset
        "kind": "byo" if spec.entrypoint else d.kind,
        "seed": d.seed,
        "path": d.path,
        "dtype": d.dtype,
        # residency is checked above against the real region; the worker compares with its own name
        "region": key if d.region is not None else None,
    }


def _training(spec: JobSpec, option: PlanOption, local_batch: int, global_batch: int) -> dict[str, Any]:
    t = spec.training
    # Without pipelining the option's micro-batches are gradient-accumulation chunks of the local
    # batch (the rules above made them divide it); a pipeline gets them as its microbatches.
    micro = option.micro_batch_size if option.pp == 1 else None
    return {
        "steps": t.steps,
        "global_batch": global_batch,
        "micro_batch": micro,
        "lr": t.lr,
        "warmup": t.warmup_steps,
        "weight_decay": t.weight_decay,
        "grad_clip": t.grad_clip if t.grad_clip > 0 else None,
        "seed": t.seed,
        # What the option was priced at: the spec's precision resolved for its devices.
        "precision": option.precision,
        "activation_checkpointing": option.activation_checkpointing,
    }


def validate_worker_config(config: dict[str, Any]) -> dict[str, Any]:
    """Check a config against the worker's own schema (``contracts.worker_config.WorkerConfig``) so a bad
    one fails placement with a clear reason instead of failing on the node; returns it as JSON."""
    from pydantic import ValidationError

    from contracts.worker_config import WorkerConfig

    try:
        parsed = WorkerConfig.model_validate(config)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in exc.errors()
        )
        raise FailedPrecondition(
            f"worker config for job {config.get('job_id')} in {config.get('region')} is invalid: {problems}",
            region=config.get("region"),
        ) from exc
    return parsed.model_dump(mode="json", exclude_none=False)
