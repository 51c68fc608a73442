"""The event log: persist an Event row in the caller's transaction, publish it once that commits.

Publishing after commit means a subscriber never hears of a change it cannot then read, and a
rolled-back change is never announced. The same mechanism carries any bus message whose meaning
depends on the transaction (e.g. assignments dispatched to nodes).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
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
# Many rows: ids returned in the order of the parameters (insertmanyvalues keeps that order).
_INSERT_EVENTS = insert(Event.__table__).returning(Event.__table__.c.id, sort_by_parameter_order=True)


def record_event(
    session: Session, bus: Bus, kind: str, job_id: str | None, payload: dict[str, Any] | None = None
) -> int:
    """Add an Event row and publish it on ``events`` (and ``job.<id>``) after commit; its id."""
    return record_events(session, bus, [(kind, job_id, payload)])[0]


def record_events(
    session: Session,
    bus: Bus,
    events: Sequence[tuple[str, str | None, dict[str, Any] | None]],
    *,
    job_channels: bool = True,
) -> list[int]:
    """``record_event`` for each (kind, job_id, payload), in one INSERT; their ids, in order.
    ``job_channels=False``: published on ``events`` only, for jobs nobody can follow yet (a job's
    stream is opened with the id its submission returns, after this commits)."""
    if not events:
        return []
    created_at = utcnow()
    rows = [
        {"job_id": job_id, "kind": kind, "payload": payload or {}, "created_at": created_at}
        for kind, job_id, payload in events
    ]
    # One Core INSERT ... RETURNING id (the ids the published messages carry), not a unit-of-work
    # flush: events are appended on every submission and transition. Whatever the session still
    # holds unwritten (a row an event refers to) is flushed first; with nothing pending that is free.
    session.flush()
    if len(rows) == 1:
        ids = [session.execute(_INSERT_EVENT, rows[0]).scalar_one()]
    else:
        ids = list(session.execute(_INSERT_EVENTS, rows).scalars())
    for event_id, row in zip(ids, rows, strict=True):
        message: Message = {
            "id": event_id,
            "kind": row["kind"],
            "job_id": row["job_id"],
            "payload": row["payload"],
            "created_at": created_at.isoformat(),
        }
        publish_after_commit(session, bus, EVENTS_CHANNEL, message)
        if job_channels and row["job_id"] is not None:
            publish_after_commit(session, bus, job_channel(row["job_id"]), message)
    return [int(i) for i in ids]


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
