"""An operator's holds on a node, apart from its liveness: cordon, drain, revocation.

``Node.status`` says whether the node is heard (alive | lost) or shut out (revoked); ``Node.cordon``
says whether the operator lets new work onto it ("" | cordoned | draining). Only ``alive`` with no
cordon is placeable (``control_layer.snapshot``, ``live_snapshot``, ``allocation``). Writes go
through the ORM in the caller's transaction, so the resource change feed carries them to every
replica's live snapshot when it commits.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from contracts.errors import FailedPrecondition, NotFound
from orchestration.bus.base import Bus
from orchestration.db.models import EnrollmentToken, Node
from orchestration.events import node_channel, publish_after_commit
from resource_layer.tokens import still_enrolls

OPEN, CORDONED, DRAINING = "", "cordoned", "draining"
REVOKED = "revoked"
# On a node's bus channel: its open stream ends with PERMISSION_DENIED (resource_layer.servicer).
REVOKED_MESSAGE_KIND = "revoked"


def _lock(session: Session, node_id: str) -> Node:
    node = session.scalars(select(Node).where(Node.id == node_id).with_for_update()).one_or_none()
    if node is None:
        raise NotFound(f"node {node_id} not found", field="node_id")
    return node


def _not_revoked(node: Node) -> None:
    if node.status == REVOKED:
        raise FailedPrecondition(f"node {node.id} is revoked", node_id=node.id, status=node.status)


def cordon(session: Session, node_id: str) -> Node:
    """No new placements on the node; what runs there keeps running. A draining node stays draining."""
    node = _lock(session, node_id)
    _not_revoked(node)
    if node.cordon == OPEN:
        node.cordon = CORDONED
    return node


def uncordon(session: Session, node_id: str) -> tuple[Node, str]:
    """Open the node to placements again (after a cordon or a drain); returns it and the hold it had.

    A drain order lasts for the agent's process: after a drain, the agent refuses new work until it
    restarts (it is not told to drain again once uncordoned).
    """
    node = _lock(session, node_id)
    _not_revoked(node)
    previous, node.cordon, node.cordon_reason = node.cordon, OPEN, ""
    return node, previous


def start_drain(session: Session, bus: Bus, node_id: str, reason: str) -> Node:
    """Cordon the node and order its agent to drain (take no new assignments), once this commits.
    A node not connected now is told when it next connects (``registry.mark_connected``)."""
    node = _lock(session, node_id)
    _not_revoked(node)
    node.cordon = DRAINING
    publish_after_commit(
        session, bus, node_channel(node_id), {"drain": {"reason": reason or "drained by an operator"}}
    )
    return node


def revoke(session: Session, bus: Bus, node_id: str, reason: str) -> Node:
    """Shut the node out: its token stops working (Register and Connect with it are refused), its
    open stream ends once this commits, and nothing is placed on it again. Its unfinished tasks are
    the control layer's to fail over (``control_layer.node_control.fail_revoked_tasks``).
    Idempotent. To bring the machine back, enroll it again as a new node."""
    node = _lock(session, node_id)
    node.status = REVOKED
    node.token_hash = ""  # matches no token: sha256 digests are 64 hex characters
    node.probe_key = ""  # nothing signs probes aimed at it any more
    message: dict[str, Any] = {REVOKED_MESSAGE_KIND: {"reason": reason or "revoked by an operator"}}
    publish_after_commit(session, bus, node_channel(node_id), message)
    return node


def usable_enrollment_token(session: Session, node: Node) -> EnrollmentToken | None:
    """The token the node enrolled with, if it would still enroll one: its agent, refused as this
    node, enrolls again with it as a new node unless it is revoked too."""
    if node.enrollment_token_id is None:
        return None
    token = session.get(EnrollmentToken, node.enrollment_token_id)
    return token if token is not None and still_enrolls(token) else None
