"""A torchrun group spanning nodes, as the control plane records it: the checkpoint its leader
reports is every node's (each holds the whole of it), a copy of it goes to a node outside the
group, a re-placement may fetch it from any of its nodes, and the failure of a node's share is
held against its node only until a group-mate's node is found lost (then it was that loss)."""

from __future__ import annotations

from sqlalchemy import select

from control_layer.checkpoint_copies import reachable_checkpoints
from control_layer.failed_nodes import nodes_to_avoid
from control_layer.reactions import on_task_metrics, on_task_status
from orchestration.context import ServerContext
from orchestration.db.engine import session_scope
from orchestration.db.models import CheckpointCopy, Node, Task
from resource_layer.liveness import node_alive_key
from tests.orchestration.fleet import add_cluster, add_tenant, submit_and_place, tiny_spec

# One two-stage replica on one-device nodes: it must span two of them.
SPEC = tiny_spec(
    parallelism={"dp": 1, "pp": 2, "tp": 1, "zero": 0},
    training={"steps": 40, "global_batch_tokens": 64, "checkpoint_every": 10},
    sync={"mode": "sync", "every": 1},
)


def _placed_group(ctx: ServerContext) -> tuple[str, Task, Task]:
    with session_scope(ctx.session_factory) as s:
        tenant = add_tenant(s)
        _, nodes = add_cluster(s, region="eu-west", name="c1", nodes=3, devices_per_node=1, price=2.0)
        for i, n in enumerate(nodes):
            n.checkpoint_port, n.probe_key = 40000 + i, f"{i:064x}"
        tenant_id, node_ids = tenant.id, [n.id for n in nodes]
    for n in node_ids:
        ctx.bus.touch(node_alive_key(n), 600)
    job = submit_and_place(ctx, tenant_id, spec=SPEC)
    assert job.status == "placed", job.reason
    with session_scope(ctx.session_factory) as s:
        tasks = s.scalars(select(Task).where(Task.job_id == job.id)).all()
        s.expunge_all()
    lead, other = sorted(tasks, key=lambda t: t.worker_config["group"]["node_rank"])
    assert lead.worker_config["group"]["nnodes"] == 2
    assert lead.worker_config["checkpoint"]["dir"] == other.worker_config["checkpoint"]["dir"] is not None
    return job.id, lead, other


def test_the_leaders_checkpoint_is_every_nodes_and_either_can_serve_it(ctx: ServerContext) -> None:
    job_id, lead, other = _placed_group(ctx)
    for t in (lead, other):
        on_task_status(ctx, t.node_id, t.id, "running", "", None, None)
    on_task_metrics(ctx, lead.node_id, lead.id, {"step": 11, "loss": 3.0, "checkpoint_step": 10})
    with session_scope(ctx.session_factory) as s:
        assert s.get(Task, lead.id).checkpoint_step == s.get(Task, other.id).checkpoint_step == 10
        held = reachable_checkpoints(s, job_id)[lead.worker_config["region"]]
        assert held["step"] == 10
        assert held["holders"] == sorted(
            [{"step": 10, "node_id": lead.node_id}, {"step": 10, "node_id": other.node_id}],
            key=lambda h: (h["step"], h["node_id"]),
        )
        # Its copy goes to the region's third node: the group's other node holds it already.
        (order,) = s.scalars(select(CheckpointCopy).where(CheckpointCopy.job_id == job_id)).all()
        assert order.source_node_id == lead.node_id and order.node_id not in (lead.node_id, other.node_id)
        # The leader's node is lost: the survivor still serves it.
        s.get(Node, lead.node_id).status = "lost"
    with session_scope(ctx.session_factory) as s:
        held = reachable_checkpoints(s, job_id)[lead.worker_config["region"]]
        assert held["holders"] == [{"step": 10, "node_id": other.node_id}]


def test_a_survivors_failure_is_held_against_its_node_only_until_its_group_mate_is_found_lost(
    ctx: ServerContext,
) -> None:
    job_id, lead, other = _placed_group(ctx)
    for t in (lead, other):
        on_task_status(ctx, t.node_id, t.id, "running", "", None, None)
    # The leader's node dies; its peer's workers fail at once (their collective's connection closed).
    on_task_status(ctx, other.node_id, other.id, "failed", "workers exited with code 1", 1, None)
    with session_scope(ctx.session_factory) as s:
        assert nodes_to_avoid(s, job_id) == {other.node_id}  # nothing tells it from a bad node yet
        s.get(Node, lead.node_id).status = "lost"
    with session_scope(ctx.session_factory) as s:
        assert nodes_to_avoid(s, job_id) == frozenset()  # the leader's task was stopped, not failed
        s.get(Task, lead.id).status = "failed"
    with session_scope(ctx.session_factory) as s:
        assert nodes_to_avoid(s, job_id) == {lead.node_id}
