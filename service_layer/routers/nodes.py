"""An operator's actions on nodes: cordon, uncordon, drain, revoke."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Path, Request

from control_layer.node_control import fail_revoked_tasks, jobs_on_node, move_jobs_off
from orchestration.db.engine import session_scope
from orchestration.db.models import Node
from resource_layer import node_admin
from service_layer.audit import audit_request
from service_layer.deps import CtxDep, FleetManager
from service_layer.schemas.access import NodeAction, NodeControlRead
from service_layer.schemas.common import error_responses

Id = Annotated[str, Path(min_length=1, max_length=64)]

router = APIRouter(tags=["nodes"], responses=error_responses(401, 403, 404, 409, 422))

ActionBody = Annotated[NodeAction | None, Body()]


def _read(node: Node) -> NodeControlRead:
    return NodeControlRead(node_id=node.id, status=node.status, cordon=node.cordon)


@router.post("/nodes/{node_id}/cordon", response_model=NodeControlRead, summary="Cordon a node")
def cordon_node(
    ctx: CtxDep, who: FleetManager, node_id: Id, request: Request, body: ActionBody = None
) -> NodeControlRead:
    """No new placements on the node from the commit on (every replica's planner snapshot drops it);
    jobs running there keep running."""
    reason = (body or NodeAction()).reason
    with session_scope(ctx.session_factory) as session:
        node = node_admin.cordon(session, node_id)
        audit_request(session, request, who, "node.cordoned", f"node {node_id}", {"reason": reason})
        out = _read(node)
    out.running_jobs = jobs_on_node(ctx, node_id)
    return out


@router.post("/nodes/{node_id}/uncordon", response_model=NodeControlRead, summary="Uncordon a node")
def uncordon_node(
    ctx: CtxDep, who: FleetManager, node_id: Id, request: Request, body: ActionBody = None
) -> NodeControlRead:
    """Open the node to placements again. After a drain, its agent takes new work once restarted."""
    reason = (body or NodeAction()).reason
    with session_scope(ctx.session_factory) as session:
        node, previous = node_admin.uncordon(session, node_id)
        audit_request(session, request, who, "node.uncordoned", f"node {node_id}", {"reason": reason})
        out = _read(node)
    if previous == node_admin.DRAINING:
        out.note = "the agent was told to drain: it takes new work once its process restarts"
    return out


@router.post("/nodes/{node_id}/drain", response_model=NodeControlRead, summary="Drain a node")
def drain_node(
    ctx: CtxDep, who: FleetManager, node_id: Id, request: Request, body: ActionBody = None
) -> NodeControlRead:
    """Cordon the node, tell its agent to drain (it accepts no new assignment, also after a
    reconnect) and move the jobs running there elsewhere (checkpoint, stop, requeue). Where the
    server has no preemption configured, they are left to finish and `note` says so."""
    reason = (body or NodeAction()).reason
    with session_scope(ctx.session_factory) as session:
        node = node_admin.start_drain(session, ctx.bus, node_id, reason)
        audit_request(session, request, who, "node.drained", f"node {node_id}", {"reason": reason})
        out = _read(node)
    jobs = move_jobs_off(ctx, node_id, reason)
    out.moved_jobs, out.running_jobs, out.note = jobs.moved, jobs.running, jobs.note
    return out


@router.delete("/nodes/{node_id}", response_model=NodeControlRead, summary="Revoke a node")
def revoke_node(
    ctx: CtxDep, who: FleetManager, node_id: Id, request: Request, body: ActionBody = None
) -> NodeControlRead:
    """The node's credentials stop working: its open stream ends, and its next Register or Connect is
    refused. Its unfinished tasks fail and their jobs are placed elsewhere. An agent refused as its
    node enrolls again with its enrollment token if that still enrolls: `note` names such a token,
    to revoke too. To bring the machine back, enroll it again (a new node). Revoking twice is a
    no-op."""
    reason = (body or NodeAction()).reason
    with session_scope(ctx.session_factory) as session:
        node = node_admin.revoke(session, ctx.bus, node_id, reason)
        audit_request(session, request, who, "node.revoked", f"node {node_id}", {"reason": reason})
        out = _read(node)
        token = node_admin.usable_enrollment_token(session, node)
        if token is not None:
            out.note = (
                f"enrollment token {token.id}, which enrolled this node, still enrolls nodes: its"
                f" agent will enroll again with it as a new node unless you revoke it too"
                f" (DELETE /v1/tokens/{token.id})"
            )
    jobs = jobs_on_node(ctx, node_id)
    fail_revoked_tasks(ctx, node_id, reason or "revoked by an operator")
    out.moved_jobs = jobs
    return out
