"""Monthly documents: a tenant's invoice and a provider's payout statement.

A month holds the transactions whose period starts in it (meters cut periods at month starts).
Lines group charges by job, kind, region and unit price; totals are the sums of the postings on
the tenant's or provider's account over those transactions, so a document always agrees with the
ledger's balances.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from orchestration.db.models import Job, LedgerAccount, LedgerPosting, LedgerTransaction
from orchestration.ledger.postings import provider_account, tenant_account


@dataclass
class Line:
    job_id: str
    job_name: str
    kind: str
    region: str
    provider: str
    unit_price: float
    quantity: float = 0.0
    amount_micros: int = 0  # the tenant's charge
    payout_micros: int = 0  # the provider's share (statements)
    transactions: int = 0


@dataclass
class Document:
    account: str
    start: datetime
    end: datetime
    lines: list[Line] = field(default_factory=list)
    total_micros: int = 0  # invoice: charged; statement: paid out
    gross_micros: int = 0  # statement: what tenants were charged for the provider's devices
    fees_micros: int = 0  # statement: what the platform kept of it


def _account_total(session: Session, name: str, txs: select) -> int:
    return int(
        session.scalar(
            select(func.coalesce(func.sum(LedgerPosting.amount_micros), 0))
            .join(LedgerAccount, LedgerAccount.id == LedgerPosting.account_id)
            .where(LedgerAccount.name == name, LedgerPosting.transaction_id.in_(txs))
        )
        or 0
    )


def _lines(session: Session, where: list, payout_account: str | None) -> list[Line]:
    payout = (
        select(LedgerPosting.transaction_id, LedgerPosting.amount_micros)
        .join(LedgerAccount, LedgerAccount.id == LedgerPosting.account_id)
        .where(LedgerAccount.name == payout_account)
        .subquery()
    )
    rows = session.execute(
        select(
            LedgerTransaction.job_id,
            func.coalesce(Job.name, ""),
            LedgerTransaction.kind,
            LedgerTransaction.region,
            LedgerTransaction.provider,
            LedgerTransaction.unit_price,
            func.sum(LedgerTransaction.quantity),
            func.sum(LedgerTransaction.amount_micros),
            func.coalesce(func.sum(payout.c.amount_micros), 0),
            func.count(LedgerTransaction.id),
        )
        .join(Job, Job.id == LedgerTransaction.job_id, isouter=True)
        .join(payout, payout.c.transaction_id == LedgerTransaction.id, isouter=True)
        .where(*where)
        .group_by(
            LedgerTransaction.job_id,
            Job.name,
            LedgerTransaction.kind,
            LedgerTransaction.region,
            LedgerTransaction.provider,
            LedgerTransaction.unit_price,
        )
        .order_by(LedgerTransaction.job_id, LedgerTransaction.kind, LedgerTransaction.region)
    ).all()
    return [
        Line(job, name, kind, region, provider, float(price), float(qty), int(amount), -int(paid), int(n))
        for job, name, kind, region, provider, price, qty, amount, paid, n in rows
    ]


def invoice(session: Session, tenant_id: str, start: datetime, end: datetime) -> Document:
    """What the tenant was charged for the month [start, end)."""
    where = [
        LedgerTransaction.tenant_id == tenant_id,
        LedgerTransaction.period_start >= start,
        LedgerTransaction.period_start < end,
    ]
    name = tenant_account(tenant_id)
    doc = Document(name, start, end, _lines(session, where, None))
    doc.total_micros = _account_total(session, name, select(LedgerTransaction.id).where(*where))
    doc.gross_micros = doc.total_micros
    return doc


def statement(session: Session, provider: str, start: datetime, end: datetime) -> Document:
    """What the provider is paid for the month [start, end): tenants' device-time charges on its
    clusters less the platform's fee."""
    where = [
        LedgerTransaction.provider == provider,
        LedgerTransaction.kind == "gpu",
        LedgerTransaction.period_start >= start,
        LedgerTransaction.period_start < end,
    ]
    name = provider_account(provider)
    doc = Document(name, start, end, _lines(session, where, name))
    doc.total_micros = -_account_total(session, name, select(LedgerTransaction.id).where(*where))
    doc.gross_micros = sum(line.amount_micros for line in doc.lines)
    doc.fees_micros = doc.gross_micros - doc.total_micros
    return doc
