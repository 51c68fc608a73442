"""The event log: persist an Event row in the caller's transaction, publish it once that commits.

Publishing after commit means a subscriber never hears of a change it cannot then read, and a
rolled-back change is never announced. The same mechanism carries any bus message whose meaning
depends on the transaction (e.g. assignments dispatched to nodes).
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import event, insert
from sqlalchemy.orm import Session

from orchestration.bus.base import Bus, Message
from orchestration.db.base import utcnow
from orchestration.db.models import Event

log = logging.getLogger(__name__)

EVENTS_CHANNEL = "events"
_PENDING_KEY = "cpn.after_commit_publications"


def job_channel(job_id: str) -> str:
    return f"job.{job_id}"


def node_channel(node_id: str) -> str:
    return f"node.{node_id}"


def publish_after_commit(session: Session, bus: Bus, channel: str, message: Message) -> None:
    """Queue ``message`` for ``channel``; it is published when ``session`` commits, dropped on rollback."""
    pending: list[tuple[Bus, str, Message]] | None = session.info.get(_PENDING_KEY)
    if pending is None:
        pending = session.info[_PENDING_KEY] = []
        event.listen(session, "after_commit", _flush_publications)
        event.listen(session, "after_rollback", _drop_publications)
    pending.append((bus, channel, message))


_INSERT_EVENT = insert(Event.__table__).returning(Event.__table__.c.id)


def record_event(
    session: Session, bus: Bus, kind: str, job_id: str | None, payload: dict[str, Any] | None = None
) -> int:
    """Add an Event row and publish it on ``events`` (and ``job.<id>``) after commit; its id."""
    created_at = utcnow()
    payload = payload or {}
    # One Core INSERT ... RETURNING id (the id the published message carries), not a unit-of-work
    # flush: an event is appended on every submission and transition. Whatever the session still
    # holds unwritten (a row the event refers to) is flushed first; with nothing pending that is free.
    session.flush()
    event_id = session.execute(
        _INSERT_EVENT, {"job_id": job_id, "kind": kind, "payload": payload, "created_at": created_at}
    ).scalar_one()
    message: Message = {
        "id": event_id,
        "kind": kind,
        "job_id": job_id,
        "payload": payload,
        "created_at": created_at.isoformat(),
    }
    publish_after_commit(session, bus, EVENTS_CHANNEL, message)
    if job_id is not None:
        publish_after_commit(session, bus, job_channel(job_id), message)
    assert isinstance(event_id, int)
    return event_id


def _flush_publications(session: Session) -> None:
    pending = session.info.get(_PENDING_KEY) or []
    session.info[_PENDING_KEY] = []
    by_bus: dict[int, tuple[Bus, list[tuple[str, Message]]]] = {}
    for bus, channel, message in pending:  # one round trip per bus, in commit order
        by_bus.setdefault(id(bus), (bus, []))[1].append((channel, message))
    for bus, messages in by_bus.values():
        try:
            bus.publish_many(messages)
        except Exception:  # the commit stands; a lost notification is recovered by readers polling the DB
            log.exception("publishing %d messages after commit failed", len(messages))


def _drop_publications(session: Session) -> None:
    if session.info.get(_PENDING_KEY):
        session.info[_PENDING_KEY] = []
