"""What nodes report of staging: the store probe offered at registration, the figures the agent
measured with it, and what its cache holds. Quotes read both (``control_layer.staging_inputs``).

Functions take a session (the caller owns the transaction); the gRPC edge runs them in a thread.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import delete, insert
from sqlalchemy.orm import Session

from contracts.errors import InvalidArgument, NotFound
from contracts.node_staging import StagingProbe, cache_report_problems, staging_probe_problems
from orchestration.artifacts import probe as store_probe
from orchestration.artifacts.store import ArtifactStore
from orchestration.artifacts.urls import get_url
from orchestration.db.base import utcnow
from orchestration.db.models import Node, NodeCacheEntry
from orchestration.settings import Settings

log = logging.getLogger(__name__)

PROBE_TICKET_JOB = "store-probe"  # the tickets' job: none, the control plane's own blobs
PROBE_TICKET_TTL_S = 3600.0  # the agent fetches right after registering


def probe_urls(store: ArtifactStore, settings: Settings, now: float) -> list[tuple[str, str, int]]:
    """(url, digest, bytes) of the store probe's blobs, small first, each written to the store where
    absent; signed like a task's fetches, so the probe takes the route staging takes."""
    blobs = store_probe.ensure(store, settings.link_probe_bytes)
    return [
        (
            get_url(
                settings,
                job_id=PROBE_TICKET_JOB,
                digest=b.digest,
                max_bytes=b.bytes,
                now=now,
                ttl_s=PROBE_TICKET_TTL_S,
            ),
            b.digest,
            b.bytes,
        )
        for b in blobs
    ]


def record_probe(session: Session, node_id: str, probe: StagingProbe, now: datetime | None = None) -> None:
    """Keep what the node measured (its previous figures go: the agent measured afresh)."""
    problems = staging_probe_problems(probe)
    if problems:
        raise InvalidArgument("invalid staging probe: " + "; ".join(problems), problems=problems)
    node = session.get(Node, node_id)
    if node is None:
        raise NotFound(f"node {node_id} not found", field="node_id")
    node.staging_probe = probe.as_dict() | {"measured_at": (now or utcnow()).isoformat()}


def replace_cache(session: Session, node_id: str, blobs: Sequence[str], venvs: Sequence[str]) -> int:
    """The node's cache is what it reports now; returns how many entries it holds."""
    problems = cache_report_problems(blobs, venvs)
    if problems:
        raise InvalidArgument("invalid cache report: " + "; ".join(problems), problems=problems)
    if session.get(Node, node_id) is None:
        raise NotFound(f"node {node_id} not found", field="node_id")
    session.execute(delete(NodeCacheEntry).where(NodeCacheEntry.node_id == node_id))
    rows = [{"node_id": node_id, "kind": "blob", "digest": d} for d in dict.fromkeys(blobs)]
    rows += [{"node_id": node_id, "kind": "venv", "digest": d} for d in dict.fromkeys(venvs)]
    if rows:
        session.execute(insert(NodeCacheEntry), rows)
    return len(rows)
