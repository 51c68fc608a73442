"""Reads of the ledger: a job's estimate next to its charges, spend, the WAN byte counter, balances,
and the transaction listing."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from contracts.states import JOB_TERMINAL
from orchestration.db.engine import as_utc
from orchestration.db.models import Job, LedgerAccount, LedgerPosting, LedgerTransaction, Task
from orchestration.ledger.metering import wan_bytes_sent
from orchestration.ledger.postings import GPU, MICROS


def wan_bytes_by_region(session: Session) -> dict[str, float]:
    """Every byte the tasks' leaders sent over the WAN, by the sending task's region: the bytes
    metered (billed) so far plus what the tasks of unfinished jobs have reported beyond them. A
    meter moves bytes from the second part to the first in one transaction, and a job's end meters
    all of them, so the total never falls (Prometheus reads a fall as a counter reset)."""
    out: dict[str, float] = {}
    billed = session.execute(
        select(Task.region, func.sum(Task.metered_egress_bytes)).group_by(Task.region)
    ).all()
    for region, n in billed:
        if n:
            out[region] = out.get(region, 0.0) + float(n)
    unbilled = session.execute(
        select(Task.region, Task.last_metrics, Task.result, Task.metered_egress_bytes)
        .join(Job, Job.id == Task.job_id)
        .where(Job.status.not_in([s.value for s in JOB_TERMINAL]))
    ).all()
    for region, last_metrics, result, metered in unbilled:
        extra = wan_bytes_sent(last_metrics, result) - metered
        if extra > 0:
            out[region] = out.get(region, 0.0) + float(extra)
    return out


def cost_summary(session: Session, job: Job) -> dict[str, Any]:
    """Estimated (from the accepted option) next to actual (from the ledger) for one job, with the
    charges summed per task and kind."""
    txs = session.scalars(
        select(LedgerTransaction).where(LedgerTransaction.job_id == job.id).order_by(LedgerTransaction.id)
    ).all()
    actual = {"device_hours": 0.0, "gpu": 0.0, "egress_gb": 0.0, "egress": 0.0}
    lines: dict[tuple[str | None, str], dict[str, Any]] = {}
    for tx in txs:
        amount = tx.amount_micros / MICROS
        if tx.kind == GPU:
            actual["device_hours"] += tx.quantity
            actual["gpu"] += amount
        else:
            actual["egress_gb"] += tx.quantity
            actual["egress"] += amount
        line = lines.setdefault(
            (tx.task_id, tx.kind),
            {"task_id": tx.task_id, "attempt": tx.attempt, "region": tx.region, "kind": tx.kind,
             "quantity": 0.0, "unit_price": tx.unit_price, "amount": 0.0, "transactions": 0},
        )  # fmt: skip
        line["quantity"] += tx.quantity
        line["amount"] += amount
        line["transactions"] += 1
    actual["total"] = actual["gpu"] + actual["egress"]
    estimates = (job.option or {}).get("estimates") or {}
    cost = estimates.get("cost") or {}
    n_devices = len((job.option or {}).get("tasks") or [])
    duration_s = float(estimates.get("duration_s") or 0.0)
    estimated = {
        "device_hours": n_devices * duration_s / 3600.0,
        "gpu": float(cost.get("devices") or 0.0),
        "egress": float(cost.get("egress") or 0.0),
        "total": float(cost.get("total") or job.estimated_cost or 0.0),
        "duration_s": duration_s,
    }
    actual_duration = None
    if job.started_at is not None and job.finished_at is not None:
        actual_duration = (as_utc(job.finished_at) - as_utc(job.started_at)).total_seconds()
    actual["duration_s"] = actual_duration
    return {"job_id": job.id, "estimated": estimated, "actual": actual, "lines": list(lines.values())}


def tenant_spend(session: Session, tenant_id: str, since: datetime | None = None) -> float:
    """What the tenant has been charged (since ``since``, by period start)."""
    query = select(func.coalesce(func.sum(LedgerTransaction.amount_micros), 0)).where(
        LedgerTransaction.tenant_id == tenant_id
    )
    if since is not None:
        query = query.where(LedgerTransaction.period_start >= since)
    return int(session.scalar(query) or 0) / MICROS


def postings_total(session: Session) -> int:
    """The sum of every posting, in micro-units: zero in a balanced ledger."""
    return int(session.scalar(select(func.coalesce(func.sum(LedgerPosting.amount_micros), 0))) or 0)


def unbalanced_transactions(session: Session) -> list[int]:
    """Ids of transactions whose postings do not sum to zero (none, in a sound ledger)."""
    return list(
        session.scalars(
            select(LedgerPosting.transaction_id)
            .group_by(LedgerPosting.transaction_id)
            .having(func.sum(LedgerPosting.amount_micros) != 0)
        )
    )


def account_balance(session: Session, name: str) -> int:
    """An account's balance in micro-units (debits positive); 0 for an account not yet made."""
    return int(
        session.scalar(
            select(func.coalesce(func.sum(LedgerPosting.amount_micros), 0))
            .join(LedgerAccount, LedgerAccount.id == LedgerPosting.account_id)
            .where(LedgerAccount.name == name)
        )
        or 0
    )


def list_transactions(
    session: Session,
    *,
    tenant_id: str | None = None,
    job_id: str | None = None,
    account: str | None = None,
    after: int = 0,
    limit: int = 100,
) -> tuple[list[LedgerTransaction], dict[int, list[tuple[str, int]]]]:
    """Transactions oldest first after the cursor ``after`` (an id), filtered, with their postings
    (account name, amount) by transaction id. ``tenant_id`` restricts to that tenant's charges."""
    query = select(LedgerTransaction).where(LedgerTransaction.id > after)
    if tenant_id is not None:
        query = query.where(LedgerTransaction.tenant_id == tenant_id)
    if job_id is not None:
        query = query.where(LedgerTransaction.job_id == job_id)
    if account is not None:
        query = query.where(
            LedgerTransaction.id.in_(
                select(LedgerPosting.transaction_id)
                .join(LedgerAccount, LedgerAccount.id == LedgerPosting.account_id)
                .where(LedgerAccount.name == account)
            )
        )
    txs = list(session.scalars(query.order_by(LedgerTransaction.id).limit(limit)))
    postings: dict[int, list[tuple[str, int]]] = {tx.id: [] for tx in txs}
    if txs:
        rows = session.execute(
            select(LedgerPosting.transaction_id, LedgerAccount.name, LedgerPosting.amount_micros)
            .join(LedgerAccount, LedgerAccount.id == LedgerPosting.account_id)
            .where(LedgerPosting.transaction_id.in_(list(postings)))
            .order_by(LedgerPosting.id)
        ).all()
        for tx_id, name, amount in rows:
            postings[tx_id].append((name, amount))
    return txs, postings
