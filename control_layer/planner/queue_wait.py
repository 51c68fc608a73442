"""A scheduler's queue priced into an option: how long its tasks wait before they start on
scheduler-backed nodes (a Slurm cluster's agent). Pure.

Each such node reports the wait a task submitted now would see (``NodeInfo.queue_wait_s``, from
``squeue`` and its recent submit-to-start times); calibration learns, per node (a Slurm cluster is
one node to cpn), how far the waits its tasks then measured landed from those reports
(``Calibration.queue_wait_s``). The option's tasks start together, so its wait is its slowest
node's. The wait comes before everything else in the option's duration; its cost does not grow
(the devices are not held, so not billed, while the job queues).
"""

from __future__ import annotations

from contracts.job_spec import JobSpec
from control_layer.planner.intervals import interval
from control_layer.planner.plan_types import Calibration, PlanOption
from control_layer.planner.snapshot import ResourceSnapshot


def node_queue_wait_s(reported: float, node: str, calibration: Calibration | None) -> float:
    """A node's wait as quoted: its report, corrected by what its measured waits taught."""
    learned = calibration.queue_wait_s.get(node, 0.0) if calibration is not None else 0.0
    return max(0.0, reported + learned)


def without_queues_past_bound(
    spec: JobSpec, snapshot: ResourceSnapshot, calibration: Calibration | None
) -> ResourceSnapshot:
    """The fleet less the nodes whose queue wait alone passes the job's time bound
    (``qos.max_hours``): no option on them could meet it, and a search that kept them could fill
    its front with options the wait then rules out, leaving none on the nodes that could run it."""
    if spec.qos.max_hours is None:
        return snapshot
    limit = spec.qos.max_hours * 3600.0
    late = {
        n.id
        for c in snapshot.clusters
        for n in c.nodes
        if node_queue_wait_s(n.queue_wait_s, n.id, calibration) > limit
    }
    if not late:
        return snapshot
    kept = [
        c.model_copy(update={"nodes": [n for n in c.nodes if n.id not in late]}) for c in snapshot.clusters
    ]
    return ResourceSnapshot.model_construct(
        regions=list(snapshot.regions),
        clusters=[c for c in kept if c.nodes],
        links=list(snapshot.links),
        taken_at=snapshot.taken_at,
    )


def queued(snapshot: ResourceSnapshot, calibration: Calibration | None) -> bool:
    """Whether any node has a queue to price (reported now, or learned)."""
    if calibration is not None and calibration.queue_wait_s:
        return True
    # Read once per snapshot: every quote asks, and a snapshot is never changed in place.
    return snapshot.derived(
        "any_queue", lambda s: any(n.queue_wait_s > 0 for c in s.clusters for n in c.nodes)
    )


def price_queue_wait(
    option: PlanOption, snapshot: ResourceSnapshot, calibration: Calibration | None = None
) -> PlanOption:
    """``option`` with ``estimates.queue_wait_s`` set and added to its duration where any of its
    nodes has a queue (or has learned one); unchanged otherwise."""
    nodes = snapshot.nodes_by_id()
    learned = calibration.queue_wait_s if calibration is not None else {}
    wait = max(
        (
            node_queue_wait_s(nodes[n].queue_wait_s, n, calibration)
            for n in {t.node for t in option.tasks}
            if n in nodes and (nodes[n].queue_wait_s > 0 or n in learned)
        ),
        default=0.0,
    )
    if wait <= 0:
        return option
    est = option.estimates
    duration = est.duration_s + wait
    priced = est.model_copy(
        update={
            "queue_wait_s": wait,
            "duration_s": duration,
            "interval": interval(duration, est.cost.total, calibration),
        }
    )
    return option.model_copy(update={"estimates": priced})
