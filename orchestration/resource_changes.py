"""Which resource rows a committed transaction changed, announced after commit to every replica.

The planner's in-memory snapshot (``control_layer.live_snapshot``) stays current by re-reading only
what changed. The feed sees changes without each write path having to remember to report them:
it collects the nodes, accelerators, allocations, clusters, prices, links, regions and providers
that a session flushed, and publishes one message per commit on ``resources.changed`` (Redis
reaches the other replicas) and to this process's callbacks (a replica reads its own writes at
once). A bulk UPDATE/DELETE/INSERT on those tables cannot be attributed to rows, so it announces
"everything" unless its caller named the rows with ``note_changes`` and marked the statement
``NOTED``. Like events, nothing is announced before the commit or after a rollback.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import ORMExecuteState, Session, sessionmaker

from orchestration.bus.base import Bus, Message
from orchestration.db.models import Accelerator, Allocation, Cluster, Link, Node, Price, Provider, Region

log = logging.getLogger(__name__)

RESOURCE_CHANGES_CHANNEL = "resources.changed"
NOTED = {"resources_noted": True}  # execution option of a bulk statement whose rows note_changes named

_JOURNAL_KEY = "cpn.resource_changes"
_FEED_ATTR = "_cpn_resource_change_feed"
_TOPOLOGY = (Link, Region, Provider)
_TRACKED = (Node, Accelerator, Allocation, Cluster, Price, *_TOPOLOGY)
_TRACKED_TABLES = frozenset(m.__table__.name for m in _TRACKED)  # type: ignore[attr-defined]
# Ids per message: past this, "everything" is cheaper to send and to apply than the list.
MAX_IDS = 5_000


@dataclass
class ResourceChanges:
    """Ids whose rows changed; ``topology`` covers regions, links and providers (small tables)."""

    nodes: set[str] = field(default_factory=set)
    clusters: set[str] = field(default_factory=set)
    accelerators: set[str] = field(default_factory=set)
    topology: bool = False
    everything: bool = False

    def __bool__(self) -> bool:
        return bool(self.nodes or self.clusters or self.accelerators or self.topology or self.everything)

    def merge(self, other: ResourceChanges) -> None:
        self.nodes |= other.nodes
        self.clusters |= other.clusters
        self.accelerators |= other.accelerators
        self.topology |= other.topology
        self.everything |= other.everything

    def to_message(self, origin: str) -> Message:
        everything = (
            self.everything or len(self.nodes) + len(self.clusters) + len(self.accelerators) > MAX_IDS
        )
        if everything:
            return {"origin": origin, "everything": True}
        return {
            "origin": origin,
            "nodes": sorted(self.nodes),
            "clusters": sorted(self.clusters),
            "accelerators": sorted(self.accelerators),
            "topology": self.topology,
        }

    @classmethod
    def from_message(cls, message: Message) -> ResourceChanges:
        """Malformed input (from an older or foreign publisher) reads as "everything": safe, never lost."""
        if not isinstance(message, dict) or message.get("everything"):
            return cls(everything=True)
        lists = [message.get(k, []) for k in ("nodes", "clusters", "accelerators")]
        if not all(isinstance(ids, list) and all(isinstance(x, str) for x in ids) for ids in lists):
            return cls(everything=True)
        return cls(
            nodes=set(lists[0]),
            clusters=set(lists[1]),
            accelerators=set(lists[2]),
            topology=bool(message.get("topology", False)),
        )


def note_changes(
    session: Session,
    *,
    nodes: Iterable[str] = (),
    clusters: Iterable[str] = (),
    accelerators: Iterable[str] = (),
    topology: bool = False,
) -> None:
    """Name rows a bulk statement of this transaction changed (mark the statement ``NOTED``)."""
    journal = _journal(session)
    journal.nodes.update(nodes)
    journal.clusters.update(clusters)
    journal.accelerators.update(accelerators)
    journal.topology |= topology


Callback = Callable[[ResourceChanges], None]


class ResourceChangeFeed:
    """Installed once per session factory; publishes on every bus of the contexts sharing it."""

    def __init__(self, session_factory: sessionmaker[Session]) -> None:
        self.origin = f"{os.getpid()}-{id(self):x}"  # lets a replica skip its own bus echoes
        self._buses: list[Bus] = []
        self._callbacks: list[Callback] = []
        self._lock = threading.Lock()
        event.listen(session_factory, "after_flush", _collect)
        event.listen(session_factory, "do_orm_execute", _bulk_statement)
        event.listen(session_factory, "after_commit", self._announce)
        event.listen(session_factory, "after_rollback", _forget)

    @classmethod
    def for_factory(cls, session_factory: sessionmaker[Session], bus: Bus) -> ResourceChangeFeed:
        feed: ResourceChangeFeed | None = getattr(session_factory, _FEED_ATTR, None)
        if feed is None:
            feed = cls(session_factory)
            setattr(session_factory, _FEED_ATTR, feed)
        feed.add_bus(bus)
        return feed

    def add_bus(self, bus: Bus) -> None:
        with self._lock:
            if all(b is not bus for b in self._buses):
                self._buses.append(bus)

    def subscribe(self, callback: Callback) -> None:
        with self._lock:
            self._callbacks.append(callback)

    def unsubscribe(self, callback: Callback) -> None:
        with self._lock:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

    def _announce(self, session: Session) -> None:
        changes = session.info.pop(_JOURNAL_KEY, None)
        if not changes:
            return
        with self._lock:
            buses, callbacks = list(self._buses), list(self._callbacks)
        for callback in callbacks:
            try:
                callback(changes)
            except Exception:
                log.exception("a resource-change callback failed")
        message = changes.to_message(self.origin)
        for bus in buses:
            try:
                bus.publish(RESOURCE_CHANGES_CHANNEL, message)
            except Exception:  # the commit stands; replicas also reload in full periodically
                log.exception("publishing resource changes failed")


def _journal(session: Session) -> ResourceChanges:
    journal = session.info.get(_JOURNAL_KEY)
    if journal is None:
        journal = session.info[_JOURNAL_KEY] = ResourceChanges()
    return journal


def _collect(session: Session, _flush_context: Any) -> None:
    # after_flush still lists what this flush wrote in new/dirty/deleted
    touched = [o for o in (*session.new, *session.dirty, *session.deleted) if isinstance(o, _TRACKED)]
    if not touched:
        return
    journal = _journal(session)
    for obj in touched:
        if isinstance(obj, Node):
            journal.nodes.add(obj.id)
        elif isinstance(obj, Accelerator):
            journal.nodes.add(obj.node_id)
        elif isinstance(obj, Allocation):
            journal.accelerators.add(obj.accelerator_id)
        elif isinstance(obj, Cluster):
            journal.clusters.add(obj.id)
        elif isinstance(obj, Price):
            journal.clusters.add(obj.cluster_id)
        else:
            journal.topology = True


def _bulk_statement(state: ORMExecuteState) -> None:
    if not (state.is_update or state.is_delete or state.is_insert):
        return
    if state.execution_options.get("resources_noted"):
        return
    table = getattr(state.statement, "table", None)
    if getattr(table, "name", None) in _TRACKED_TABLES:
        _journal(state.session).everything = True


def _forget(session: Session) -> None:
    session.info.pop(_JOURNAL_KEY, None)
