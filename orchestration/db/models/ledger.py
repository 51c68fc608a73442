"""The double-entry ledger: accounts, transactions and their postings.

Money is held in integer micro-units (1e-6 of the currency) so that a transaction's postings sum to
exactly zero. A posting's amount is signed: positive debits the account, negative credits it. A
tenant's account is debited what it is charged; a provider's account is credited its payout and
the platform's accounts (``platform:fees``, ``platform:egress``) what the platform keeps.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, Index, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from orchestration.db.base import Base, utcnow


class LedgerAccount(Base):
    """``tenant:<id>``, ``provider:<name>``, ``platform:fees`` or ``platform:egress``; made on demand."""

    __tablename__ = "ledger_accounts"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    kind: Mapped[str] = mapped_column(String(16))  # tenant | provider | platform
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class LedgerTransaction(Base):
    """One charge: device time or egress of one task over one period, its postings summing to zero.

    A task's meters follow each other without gaps or overlaps (its ``metered_until`` and
    ``metered_egress_bytes`` watermarks), so (task, kind, meter_from) names a charge once: the
    unique constraint refuses a second charge for the same period whatever raced to write it."""

    __tablename__ = "ledger_transactions"
    __table_args__ = (
        UniqueConstraint("task_id", "kind", "meter_from", name="uq_ledger_transactions_task_meter"),
        Index("ix_ledger_transactions_tenant_period", "tenant_id", "period_start"),
        Index("ix_ledger_transactions_provider_period", "provider", "period_start"),
    )

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(16))  # gpu (device-hours) | egress (GB sent over the WAN)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    task_id: Mapped[str | None] = mapped_column(ForeignKey("tasks.id"), default=None)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    provider: Mapped[str] = mapped_column(String(128), default="")  # the provider's name
    region: Mapped[str] = mapped_column(String(64), default="")
    cluster_id: Mapped[str | None] = mapped_column(ForeignKey("clusters.id"), default=None)
    attempt: Mapped[int] = mapped_column(default=0)
    quantity: Mapped[float]  # device-hours or GB
    unit_price: Mapped[float]  # per device-hour or per GB, as locked in at placement
    amount_micros: Mapped[int] = mapped_column(BigInteger)  # what the tenant is charged
    fee_rate: Mapped[float] = mapped_column(default=0.0)  # the platform's share of a device-time charge
    period_start: Mapped[datetime]
    period_end: Mapped[datetime]
    # Where the charge starts on the task's meter: µs since the epoch (gpu) or bytes already billed (egress).
    meter_from: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class LedgerPosting(Base):
    __tablename__ = "ledger_postings"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    transaction_id: Mapped[int] = mapped_column(ForeignKey("ledger_transactions.id"), index=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("ledger_accounts.id"), index=True)
    amount_micros: Mapped[int] = mapped_column(BigInteger)  # > 0 debit, < 0 credit
