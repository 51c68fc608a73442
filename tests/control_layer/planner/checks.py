"""Independent checks of an option against its spec and snapshot (not the planner's own checks)."""

from __future__ import annotations

import math
from collections import defaultdict

from contracts.feasibility import resolve_precision
from contracts.job_spec import JobSpec
from control_layer.planner import cost_model as cm
from control_layer.planner.estimate import estimate_option
from control_layer.planner.placement import Placement
from control_layer.planner.plan_types import PlanOption
from control_layer.planner.snapshot import ResourceSnapshot


def check_option(spec: JobSpec, snap: ResourceSnapshot, o: PlanOption) -> None:
    """Raise AssertionError when the option breaks a rule of the issue."""
    q = spec.qos
    clusters = {c.id: c for c in snap.clusters}
    nodes = {(c.id, n.id): n for c in snap.clusters for n in c.nodes}
    used = set()
    by_rank = defaultdict(list)
    for t in o.tasks:
        key = (t.cluster, t.node, t.device)
        assert key not in used, f"device used twice: {key}"
        used.add(key)
        node = nodes[(t.cluster, t.node)]
        assert node.alive
        slot = next(d for d in node.devices if d.index == t.device)
        assert slot.free, f"busy device placed: {key}"
        assert t.region == clusters[t.cluster].region
        by_rank[t.dp_rank].append((t, slot))
    assert sorted(by_rank) == list(range(o.dp))
    assert len(o.tasks) == o.dp * o.tp * o.pp
    for rank, group in by_rank.items():
        assert sorted((t.pp_stage, t.tp_rank) for t, _ in group) == [
            (s, r) for s in range(o.pp) for r in range(o.tp)
        ], rank
        # The search keeps a replica on one node (the runtime could run it across nodes of a cluster).
        assert len({(t.cluster, t.node) for t, _ in group}) == 1, "a replica must sit in one node"
    counts = defaultdict(int)
    for group in by_rank.values():
        for c in {t.cluster for t, _ in group}:
            counts[c] += 1
    assert dict(counts) == o.replicas_per_cluster
    regions = {clusters[t.cluster].region for t in o.tasks}
    assert sorted(regions) == sorted(o.regions)
    kinds = {s.kind for g in by_rank.values() for _, s in g}
    assert o.precision == resolve_precision(spec.training.precision, kinds)
    assert o.activation_checkpointing == spec.training.activation_checkpointing
    if spec.entrypoint is not None:
        assert o.tp == o.pp == 1 and (o.zero == 0 or "zero" in spec.byo_parallelism)
    slots = [s for g in by_rank.values() for _, s in g]

    # QoS, recomputed from the tasks.
    e = o.estimates
    if q.max_hours is not None:
        assert e.duration_s <= q.max_hours * 3600 * (1 + 1e-9)
    if q.max_cost is not None:
        assert e.cost.total <= q.max_cost * (1 + 1e-9)
    if q.regions is not None:
        assert regions <= set(q.regions)
    assert not regions & set(q.exclude_regions)
    if q.data_residency:
        assert all(snap.jurisdiction(r).upper() == q.data_residency.upper() for r in regions)
    if spec.data.region:
        assert regions == {spec.data.region}
    if q.accelerators:
        assert all(any(a.lower() in s.model.lower() for a in q.accelerators) for s in slots)
    if q.min_gpu_mem_gb is not None:
        assert all(s.memory_gb >= q.min_gpu_mem_gb for s in slots)
    if not q.preemptible:
        assert not o.spot
    assert all(c.ok for c in o.qos_checks)

    # The numbers: re-estimated from the tasks, they agree; the breakdowns add up; memory fits.
    again = estimate_option(
        Placement(
            spec,
            snap,
            o.tasks,
            dp=o.dp,
            tp=o.tp,
            pp=o.pp,
            zero=o.zero,
            pp_schedule=o.pp_schedule,
            spot=o.spot,
        ),
        runtime=o.runtime,
    )
    assert again == e
    s = e.step_s
    parts = s.data + s.compute + s.optimizer + s.tp_comm + s.dp_comm + s.pp_bubble + s.pp_comm
    assert math.isclose(s.total, parts + s.wan_sync + s.checkpoint)
    assert math.isclose(e.duration_s, e.startup_s + e.steps * s.total + e.final_sync_s + e.teardown_s)
    assert math.isclose(e.cost.total, e.cost.devices + e.cost.egress)
    assert e.memory_per_device_gb <= cm.USABLE_MEMORY_FRACTION * min(x.memory_gb for x in slots) * (1 + 1e-9)
    assert set(o.sync.ring) <= {t.cluster for t in o.tasks}


def check_front(options: list[PlanOption]) -> None:
    """No option is dominated by another (both duration and cost no worse, one better)."""
    pts = [(o.estimates.duration_s, o.estimates.cost.total) for o in options]
    for i, a in enumerate(pts):
        for j, b in enumerate(pts):
            if i != j:
                assert not (b[0] <= a[0] and b[1] <= a[1] and (b[0] < a[0] or b[1] < a[1])), (a, b)
    assert len({o.id for o in options}) == len(options)
