"""A real agent process drained and then revoked by an operator."""

from __future__ import annotations

from sqlalchemy import func, select

from control_layer.node_control import fail_revoked_tasks
from orchestration.db.models import EnrollmentToken, Node
from resource_layer import node_admin
from resource_layer.liveness import node_alive_key
from resource_layer.tokens import revoke_enrollment_token
from tests.agent.conftest import Plane, StartAgent, node_of
from tests.agent.test_agent_process import FINISHING, dispatch, wait_status
from tests.resource_layer.harness import wait_for


def _revoke(plane: Plane, node_id: str) -> str | None:
    """Revoke the node as the REST route does; the id of its enrollment token if that still enrolls."""
    with plane.ctx.session_factory() as s, s.begin():
        node = node_admin.revoke(s, plane.ctx.bus, node_id, "decommissioned")
        token = node_admin.usable_enrollment_token(s, node)
    fail_revoked_tasks(plane.ctx, node_id, "decommissioned")
    return token.id if token is not None else None


def _node_count(plane: Plane) -> int:
    with plane.ctx.session_factory() as s:
        return s.scalar(select(func.count()).select_from(Node)) or 0


def test_a_drained_agent_takes_no_work_and_a_revoked_one_is_shut_out(
    plane: Plane, start_agent: StartAgent
) -> None:
    agent = start_agent()
    node = node_of(plane)
    wait_for(lambda: plane.ctx.bus.alive(node_alive_key(node.id)), timeout=30, what="the agent's stream")

    with plane.ctx.session_factory() as s, s.begin():
        node_admin.start_drain(s, plane.ctx.bus, node.id, "rack maintenance")
    wait_for(lambda: "drain ordered: rack maintenance" in agent.log(), what="the agent to hear the drain")
    refused = wait_status(plane, dispatch(plane, node, FINISHING), "failed", "succeeded")
    assert (refused.status, refused.message) == ("failed", "node is draining")

    # Revoked alone, the node is shut out, but its agent still holds a token that enrolls (10
    # uses): refused as this node, it enrolls again as a new one. The revocation says so.
    token_id = _revoke(plane, node.id)
    with plane.ctx.session_factory() as s:
        assert token_id == s.scalars(select(EnrollmentToken.id)).one()
    wait_for(lambda: "PERMISSION_DENIED" in agent.log(), what="the agent's stream to end")
    wait_for(lambda: "node credentials refused on connect" in agent.log(), what="Connect to refuse it")
    wait_for(lambda: _node_count(plane) == 2, timeout=30, what="the agent to enroll again")
    with plane.ctx.session_factory() as s:
        old = s.get(Node, node.id)
        assert old is not None and (old.status, old.token_hash) == ("revoked", "")
        new = s.scalars(select(Node).where(Node.id != node.id)).one()

    # Revoked together with its token, the machine cannot come back: the agent gives up.
    assert token_id is not None
    with plane.ctx.session_factory() as s, s.begin():
        revoke_enrollment_token(s, token_id)
    assert _revoke(plane, new.id) is None
    assert agent.proc.wait(30) == 2
    assert "registration refused (UNAUTHENTICATED)" in agent.log()
    assert _node_count(plane) == 2
