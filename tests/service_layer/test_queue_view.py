"""``GET /v1/queue``'s read on a real database: admission order is applied before the limit, so a
queue longer than the limit is cut at its tail, never somewhere in its middle."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy.orm import Session, sessionmaker

from orchestration.db.engine import session_scope
from orchestration.db.models import Job, Tenant
from service_layer.queue_view import queue_entries
from tests.orchestration.fleet import add_tenant

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def _job(
    session: Session,
    tenant_id: str,
    name: str,
    *,
    position: int | None,
    priority: int = 0,
    age_s: int = 0,
    status: str = "queued",
) -> None:
    session.add(
        Job(
            tenant_id=tenant_id,
            name=name,
            spec={},
            status=status,
            priority=priority,
            queue_position=position,
            created_at=T0 - timedelta(seconds=age_s),
        )
    )
    session.flush()  # one row at a time: the table holds them in this order


def test_the_limit_cuts_the_queue_after_admission_order(session_factory: sessionmaker[Session]) -> None:
    with session_scope(session_factory) as s:
        admin, alice, bob = add_tenant(s, "root", is_admin=True), add_tenant(s, "alice"), add_tenant(s, "bob")
        # Stored in reverse admission order, so a limit taken before ordering keeps the tail.
        _job(s, alice.id, "requeued-low", position=None, priority=0, age_s=90)
        _job(s, bob.id, "requeued-high", position=None, priority=3, age_s=10)
        _job(s, bob.id, "third", position=3, age_s=50)
        _job(s, alice.id, "second", position=2, age_s=60)
        _job(s, bob.id, "submitted-since", position=2, priority=5, age_s=5)  # counted at submission
        _job(s, alice.id, "first", position=1, age_s=70)
        _job(s, alice.id, "running", position=None, status="running", age_s=100)
        admin_id, alice_id = admin.id, alice.id

    order = ["first", "submitted-since", "second", "third", "requeued-high", "requeued-low"]
    with session_factory() as s:
        admin, alice = s.get_one(Tenant, admin_id), s.get_one(Tenant, alice_id)
        assert [e.name for e in queue_entries(s, admin)] == order
        assert [e.name for e in queue_entries(s, admin, limit=2)] == order[:2]
        assert [e.name for e in queue_entries(s, alice, limit=2)] == ["first", "second"]
        assert [e.name for e in queue_entries(s, alice)] == ["first", "second", "requeued-low"]
        assert [e.position for e in queue_entries(s, admin, limit=4)] == [1, 2, 2, 3]
