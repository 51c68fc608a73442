"""Copies of a job's complete checkpoints on other nodes of the same region, so that a task whose
node is gone resumes from one instead of from the peers' model or from step 0.

After a task reports a newer complete checkpoint (``on_task_metrics``), ``order_copy`` picks
another live node of its region that serves checkpoints and, after the commit, orders it to fetch
the checkpoint from the task's node (a ticket signed with the holder's probe key, and the job's
checkpoint credentials for the receiver: the copy runs over mutual TLS with the job's CA, as its
sync does, and the receiver serves it with them later); the copy runs in the background on both
agents while the task trains on. The receiver reports the result
(``record_copy_result``), which records where the checkpoint now has a copy. When a task is placed
on a node lacking the checkpoint it should resume from, ``reachable_checkpoints`` tells the worker
config builder which live nodes hold which steps, and ``sign_fetches`` turns its choice into a
ticket the replacement's agent fetches with before launching the workers.

Runs inside the caller's transaction.
"""

from __future__ import annotations

import math
import time
from datetime import timedelta
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from contracts.checkpoint_transfer import (
    MAX_TICKET_TTL_S,
    CheckpointTicket,
    check_dir,
    checkpoint_bytes_bound,
    sign,
)
from contracts.errors import FailedPrecondition, InvalidArgument, NotFound
from contracts.model import GPTConfig, gpt_param_count
from control_layer.checkpoints import checkpoint_records, job_checkpoints
from control_layer.snapshot import current_prices
from control_layer.worker_config import job_sync_secret
from orchestration.context import ServerContext
from orchestration.db.base import new_id, utcnow
from orchestration.db.models import CheckpointCopy, Cluster, Node, Task
from orchestration.events import publish_after_commit, record_event
from orchestration.sync_tls import checkpoint_credentials
from resource_layer.liveness import node_alive_key

KEEP_COPIES = 2  # complete steps a receiving agent keeps per directory (agent.checkpoint_transfer)
COPY_TTL_S = 600.0  # a copy order not answered by then has failed


def participant(task: Task) -> str:
    return str((task.worker_config or {}).get("region") or task.region)


def _dir(config: dict[str, Any]) -> str | None:
    d = (config.get("checkpoint") or {}).get("dir")
    try:
        check_dir(d) if isinstance(d, str) else None
    except InvalidArgument:
        return None
    return d if isinstance(d, str) else None


def _max_bytes(config: dict[str, Any]) -> int:
    model = config.get("model")
    try:
        n = gpt_param_count(GPTConfig.model_validate(model)) if isinstance(model, dict) else None
    except ValueError:
        n = None
    return checkpoint_bytes_bound(n)


def _expires(ttl_s: float) -> float:
    # Whole seconds: the expiry crosses JSON and protobuf and must sign the same on both ends
    # (rounded down: a source refuses a ticket claiming more than MAX_TICKET_TTL_S).
    return float(math.floor(time.time() + min(ttl_s, MAX_TICKET_TTL_S)))


def _ticket(
    session: Session, row: CheckpointCopy, max_bytes: int, ttl_s: float
) -> tuple[CheckpointTicket, Node]:
    source = session.get(Node, row.source_node_id)
    if source is None or not source.probe_key or source.checkpoint_port <= 0:
        raise FailedPrecondition(f"node {row.source_node_id} serves no checkpoints")
    ticket = sign(
        source.probe_key,
        CheckpointTicket(row.id, source.id, row.dir, row.step, max_bytes, _expires(ttl_s)),
    )
    return ticket, source


def _ticket_dict(ticket: CheckpointTicket) -> dict[str, Any]:
    return {
        "transfer_id": ticket.transfer_id,
        "source_node_id": ticket.source_node_id,
        "dir": ticket.dir,
        "step": ticket.step,
        "max_bytes": ticket.max_bytes,
        "expires_at": ticket.expires_at,
        "mac": ticket.mac,
    }


def _copy_target(ctx: ServerContext, session: Session, task: Task, key: str) -> str | None:
    """Another live node of the task's region that serves checkpoints: the one already holding
    this participant's copies (its older copies are pruned there), else the cheapest (the one a
    re-placement most likely takes, so it finds the copy where it runs), then by id. Not a node of
    the task's own group spanning nodes: each of those holds the whole checkpoint already."""
    attempt = session.scalars(select(Task).where(Task.job_id == task.job_id, Task.attempt == task.attempt))
    holding = {task.node_id} | {
        t.node_id for t in attempt if participant(t) == key and (t.worker_config or {}).get("group")
    }
    rows = session.execute(
        select(Node.id, Node.cluster_id)
        .join(Cluster, Cluster.id == Node.cluster_id)
        .where(
            Cluster.region == task.region,
            Node.id.not_in(holding),
            Node.status == "alive",
            Node.checkpoint_port > 0,
            Node.probe_key != "",
        )
    ).all()
    live = [r for r in rows if ctx.bus.alive(node_alive_key(r.id))]
    if not live:
        return None
    held = set(
        session.scalars(
            select(CheckpointCopy.node_id).where(
                CheckpointCopy.job_id == task.job_id,
                CheckpointCopy.participant == key,
                CheckpointCopy.status == "ok",
            )
        )
    )
    prices = current_prices(session, sorted({r.cluster_id for r in live}))

    def rank(r: Any) -> tuple[bool, float, str]:
        price = prices.get(r.cluster_id)
        return (r.id not in held, price.price_per_device_hour if price else math.inf, r.id)

    return min(live, key=rank).id


def _expire_pending(session: Session, job_id: str) -> None:
    now = utcnow()
    session.execute(
        update(CheckpointCopy)
        .where(
            CheckpointCopy.job_id == job_id,
            CheckpointCopy.status == "pending",
            CheckpointCopy.requested_at < now - timedelta(seconds=MAX_TICKET_TTL_S),
        )
        .values(status="failed", error="no result before the ticket expired", finished_at=now)
    )


def order_copy(ctx: ServerContext, session: Session, task: Task) -> CheckpointCopy | None:
    """Order a copy of ``task``'s newest complete checkpoint onto another live node of its region
    (sent after the commit); None when the region has no such node or the task's node serves none."""
    step = task.checkpoint_step
    d = _dir(task.worker_config or {})
    if not step or d is None:
        return None
    source = session.get(Node, task.node_id)
    if source is None or source.checkpoint_port <= 0 or not source.probe_key:
        return None
    key = participant(task)
    target = _copy_target(ctx, session, task, key)
    if target is None:
        return None
    _expire_pending(session, task.job_id)
    row = CheckpointCopy(
        id=new_id(),
        job_id=task.job_id,
        participant=key,
        dir=d,
        step=int(step),
        source_node_id=source.id,
        node_id=target,
        purpose="copy",
    )
    session.add(row)
    ticket, _ = _ticket(session, row, _max_bytes(task.worker_config or {}), COPY_TTL_S)
    secret = job_sync_secret(ctx.settings.secret_key, task.job_id)
    order = {
        "checkpoint_copy": {
            "ticket": _ticket_dict(ticket),
            "source_host": source.advertise_host,
            "source_port": source.checkpoint_port,
            "job_id": task.job_id,
            "tls": checkpoint_credentials(secret, task.job_id, target),
        }
    }
    publish_after_commit(session, ctx.bus, f"node.{target}", order)
    return row


def record_copy_result(
    ctx: ServerContext, session: Session, node_id: str, result: dict[str, Any]
) -> CheckpointCopy:
    """Store how node ``node_id``'s copy or fetch went, with an event on the job."""
    transfer_id = str(result.get("transfer_id", ""))
    row = session.get(CheckpointCopy, transfer_id) if transfer_id else None
    if row is None or row.node_id != node_id:
        raise NotFound(
            f"transfer_id: no checkpoint copy {transfer_id!r} was ordered to this node", field="transfer_id"
        )
    if row.status != "pending":
        raise FailedPrecondition(f"checkpoint copy {transfer_id} is already {row.status}")
    nbytes, seconds = result.get("bytes", 0), result.get("duration_s", 0.0)
    if not all(isinstance(x, int | float) and math.isfinite(x) and x >= 0 for x in (nbytes, seconds)):
        raise InvalidArgument(
            "checkpoint_copy_result: figures must be finite and non-negative", field="bytes"
        )
    error = str(result.get("error", ""))[:500]
    row.status = "failed" if error else "ok"
    row.error, row.bytes, row.duration_s, row.finished_at = error, int(nbytes), float(seconds), utcnow()
    ok, failed = {
        "copy": ("job.checkpoint_copied", "job.checkpoint_copy_failed"),
        "fetch": ("job.checkpoint_fetched", "job.checkpoint_fetch_failed"),
    }[row.purpose]
    kind = failed if error else ok
    payload = {
        "participant": row.participant,
        "step": row.step,
        "node_id": row.node_id,
        "source_node_id": row.source_node_id,
        "bytes": row.bytes,
        "duration_s": round(row.duration_s, 3),
    }
    if result.get("assignment_id"):
        payload["task_id"] = str(result["assignment_id"])[:64]
    if error:
        payload["error"] = error
    record_event(session, ctx.bus, kind, row.job_id, payload)
    session.flush()
    if not error:
        _prune(session, row)
    return row


def _prune(session: Session, row: CheckpointCopy) -> None:
    """The receiver keeps its newest ``KEEP_COPIES`` steps of the directory; so does the record."""
    keep = session.scalars(
        select(CheckpointCopy.id)
        .where(
            CheckpointCopy.job_id == row.job_id,
            CheckpointCopy.participant == row.participant,
            CheckpointCopy.node_id == row.node_id,
            CheckpointCopy.status == "ok",
        )
        .order_by(CheckpointCopy.step.desc(), CheckpointCopy.requested_at.desc())
        .limit(KEEP_COPIES)
    ).all()
    session.execute(
        delete(CheckpointCopy).where(
            CheckpointCopy.job_id == row.job_id,
            CheckpointCopy.participant == row.participant,
            CheckpointCopy.node_id == row.node_id,
            CheckpointCopy.status == "ok",
            CheckpointCopy.id.not_in(keep),
        )
    )


def reachable_checkpoints(session: Session, job_id: str) -> dict[str, dict[str, Any]]:
    """``job_checkpoints`` restricted to what live nodes still hold: per participant its newest
    step some live node holds (``step``, ``node_id`` as before), and ``holders``, every (step,
    node) known to hold a complete checkpoint. A participant whose checkpoints all died with their
    nodes is left out (its replacement takes the peers' model)."""
    recorded = job_checkpoints(session, job_id)
    alive = set(session.scalars(select(Node.id).where(Node.status == "alive")))
    holders: dict[str, set[tuple[int, str]]] = {}
    # Every task's record, not only the newest: the nodes of a group spanning nodes each hold it.
    for rec in checkpoint_records(session, job_id):
        if rec.node_id in alive:
            holders.setdefault(rec.participant, set()).add((rec.step, rec.node_id))
    copies = session.execute(
        select(CheckpointCopy.participant, CheckpointCopy.step, CheckpointCopy.node_id).where(
            CheckpointCopy.job_id == job_id, CheckpointCopy.status == "ok"
        )
    )
    for key, step, node in copies:
        if node in alive:
            holders.setdefault(key, set()).add((int(step), node))
    out: dict[str, dict[str, Any]] = {}
    for key, held in holders.items():
        step, node = max(held)
        base = recorded.get(key, {"participant": key})
        own = base.get("node_id")
        out[key] = base | {
            "step": step,
            "node_id": own if (step, own) in held else node,
            "holders": [{"step": s, "node_id": n} for s, n in sorted(held)],
        }
    return out


def sign_fetches(session: Session, job_id: str, configs: dict[str, dict[str, Any]]) -> None:
    """Turn each config's ``checkpoint.fetch`` choice (``{step, source_node_id}``, made by
    ``worker_config``) into a signed ticket and the source's address, recording the fetch as a
    pending copy to the config's node; a source that serves no checkpoints drops the choice."""
    for node_id, config in configs.items():
        ck = config.get("checkpoint") or {}
        choice = ck.get("fetch")
        d = _dir(config)
        if not choice:
            continue
        row = CheckpointCopy(
            id=new_id(),
            job_id=job_id,
            participant=str(config.get("region")),
            dir=d or "",
            step=int(choice["step"]),
            source_node_id=str(choice["source_node_id"]),
            node_id=node_id,
            purpose="fetch",
        )
        try:
            if d is None:
                raise FailedPrecondition("no checkpoint directory")
            ticket, source = _ticket(session, row, _max_bytes(config), MAX_TICKET_TTL_S)
        except FailedPrecondition:
            ck["fetch"] = None
            continue
        session.add(row)
        ck["fetch"] = _ticket_dict(ticket) | {"host": source.advertise_host, "port": source.checkpoint_port}
