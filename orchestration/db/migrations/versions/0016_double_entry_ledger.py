"""Double-entry ledger: accounts, transactions and postings replace the single-entry charge lines;
tasks carry their platform fee and metering watermarks.

Each old ``ledger_entries`` row becomes one transaction: a gpu line debits the tenant and credits
the provider less the default platform fee (10 %, the fee when nothing else was configured) and
``platform:fees`` the fee; an egress line debits the tenant and credits ``platform:egress``. Tasks
of jobs that had ended are marked metered up to their end (and their egress bytes as billed), so
nothing is charged twice; tasks of live jobs are metered from their start by the new meter.

Revision ID: 0016
Revises: 0019
Create Date: 2026-11-25
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

DEFAULT_FEE = 0.1
TERMINAL = ("succeeded", "failed", "cancelled")
_US = timedelta(microseconds=1)
_TZ = sa.DateTime(timezone=True)
# The rows this migration writes, typed, so each database stores the times its own way.
ACCOUNTS = sa.table("ledger_accounts", sa.column("id", sa.Integer), sa.column("name", sa.String),
                    sa.column("kind", sa.String), sa.column("created_at", _TZ))  # fmt: skip
TRANSACTIONS = sa.table(
    "ledger_transactions",
    *(sa.column(c) for c in ("kind", "job_id", "task_id", "tenant_id", "provider", "region", "cluster_id")),
    *(sa.column(c) for c in ("attempt", "quantity", "unit_price", "amount_micros", "fee_rate", "meter_from")),
    sa.column("id", sa.Integer),
    sa.column("period_start", _TZ),
    sa.column("period_end", _TZ),
    sa.column("created_at", _TZ),
)
POSTINGS = sa.table(
    "ledger_postings", sa.column("transaction_id"), sa.column("account_id"), sa.column("amount_micros")
)
TASKS = sa.table("tasks", sa.column("id"), sa.column("metered_until", _TZ), sa.column("metered_egress_bytes"))


def _utc(t: datetime | str | None) -> datetime | None:
    if t is None:
        return None
    if isinstance(t, str):
        t = datetime.fromisoformat(t)
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def _round(x: Decimal) -> int:
    return int(x.to_integral_value(rounding=ROUND_HALF_EVEN))


def _sent(*sources: object) -> int:
    sent = 0
    for source in sources:
        if isinstance(source, str):
            source = json.loads(source)
        if isinstance(source, dict):
            v = source.get("wan_bytes_sent")
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > sent:
                sent = int(v)
    return sent


def upgrade() -> None:
    op.create_table(
        "ledger_accounts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ledger_accounts")),
        sa.UniqueConstraint("name", name=op.f("uq_ledger_accounts_name")),
    )
    op.create_table(
        "ledger_transactions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("task_id", sa.String(length=32), nullable=True),
        sa.Column("tenant_id", sa.String(length=32), nullable=False),
        sa.Column("provider", sa.String(length=128), nullable=False),
        sa.Column("region", sa.String(length=64), nullable=False),
        sa.Column("cluster_id", sa.String(length=32), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("quantity", sa.Double(), nullable=False),
        sa.Column("unit_price", sa.Double(), nullable=False),
        sa.Column("amount_micros", sa.BigInteger(), nullable=False),
        sa.Column("fee_rate", sa.Double(), nullable=False),
        sa.Column("period_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("period_end", sa.DateTime(timezone=True), nullable=False),
        sa.Column("meter_from", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["cluster_id"], ["clusters.id"], name=op.f("fk_ledger_transactions_cluster_id_clusters")
        ),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_ledger_transactions_job_id_jobs")),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], name=op.f("fk_ledger_transactions_task_id_tasks")),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_ledger_transactions_tenant_id_tenants")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ledger_transactions")),
        sa.UniqueConstraint("task_id", "kind", "meter_from", name="uq_ledger_transactions_task_meter"),
    )
    with op.batch_alter_table("ledger_transactions") as batch:
        batch.create_index(batch.f("ix_ledger_transactions_job_id"), ["job_id"], unique=False)
        batch.create_index(
            "ix_ledger_transactions_tenant_period", ["tenant_id", "period_start"], unique=False
        )
        batch.create_index(
            "ix_ledger_transactions_provider_period", ["provider", "period_start"], unique=False
        )
    op.create_table(
        "ledger_postings",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("transaction_id", sa.Integer(), nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("amount_micros", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["account_id"], ["ledger_accounts.id"], name=op.f("fk_ledger_postings_account_id_ledger_accounts")
        ),
        sa.ForeignKeyConstraint(
            ["transaction_id"],
            ["ledger_transactions.id"],
            name=op.f("fk_ledger_postings_transaction_id_ledger_transactions"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ledger_postings")),
    )
    with op.batch_alter_table("ledger_postings") as batch:
        batch.create_index(batch.f("ix_ledger_postings_account_id"), ["account_id"], unique=False)
        batch.create_index(batch.f("ix_ledger_postings_transaction_id"), ["transaction_id"], unique=False)
    # Plain ALTER TABLE ... ADD COLUMN: a batch copy of tasks would drop the table others refer to.
    op.add_column(
        "tasks", sa.Column("platform_fee", sa.Double(), server_default=sa.text("0.1"), nullable=False)
    )
    op.add_column("tasks", sa.Column("metered_until", sa.DateTime(timezone=True), nullable=True))
    op.add_column(
        "tasks",
        sa.Column("metered_egress_bytes", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
    )
    _move_entries_to_transactions()
    with op.batch_alter_table("ledger_entries") as batch:
        batch.drop_index(batch.f("ix_ledger_entries_tenant_id"))
        batch.drop_index(batch.f("ix_ledger_entries_job_id"))
    op.drop_table("ledger_entries")


def _move_entries_to_transactions() -> None:
    conn = op.get_bind()
    accounts: dict[str, int] = {}

    def account(name: str) -> int:
        if name not in accounts:
            conn.execute(
                ACCOUNTS.insert().values(name=name, kind=name.split(":", 1)[0], created_at=datetime.now(UTC))
            )
            accounts[name] = conn.execute(
                sa.select(ACCOUNTS.c.id).where(ACCOUNTS.c.name == name)
            ).scalar_one()
        return accounts[name]

    entries = conn.execute(
        sa.text(
            "SELECT e.id, e.job_id, e.tenant_id, e.task_id, e.attempt, e.region, e.cluster_id, e.kind,"
            " e.quantity, e.unit_price, e.amount, e.created_at, t.started_at, t.finished_at, p.name"
            " FROM ledger_entries e LEFT JOIN tasks t ON t.id = e.task_id"
            " LEFT JOIN clusters c ON c.id = e.cluster_id LEFT JOIN providers p ON p.id = c.provider_id"
            " ORDER BY e.id"
        )
    ).all()
    for (_, job_id, tenant_id, task_id, attempt, region, cluster_id, kind, quantity, unit_price, amount,
         created, started, finished, provider) in entries:  # fmt: skip
        micros = _round(Decimal(repr(float(amount))) * 1_000_000)
        start = _utc(started) or _utc(created)
        end = _utc(finished) or _utc(created)
        gpu = kind == "gpu"
        provider = provider or "unknown"
        meter_from = (
            (start - datetime(1970, 1, 1, tzinfo=UTC)) // _US if gpu else 0  # egress: from 0 bytes billed
        )
        tx = conn.execute(
            TRANSACTIONS.insert()
            .values(kind=kind, job_id=job_id, task_id=task_id, tenant_id=tenant_id, provider=provider,
                    region=region, cluster_id=cluster_id, attempt=attempt, quantity=quantity,
                    unit_price=unit_price, amount_micros=micros, fee_rate=DEFAULT_FEE if gpu else 0.0,
                    period_start=start, period_end=end, meter_from=meter_from, created_at=_utc(created))
            .returning(TRANSACTIONS.c.id)
        ).scalar_one()  # fmt: skip
        if gpu:
            fee = _round(Decimal(micros) * Decimal(repr(DEFAULT_FEE)))
            postings = [(f"tenant:{tenant_id}", micros), (f"provider:{provider}", -(micros - fee)),
                        ("platform:fees", -fee)]  # fmt: skip
        else:
            postings = [(f"tenant:{tenant_id}", micros), ("platform:egress", -micros)]
        for name, value in postings:
            conn.execute(
                POSTINGS.insert().values(transaction_id=tx, account_id=account(name), amount_micros=value)
            )
    # Ended jobs were charged in full: their tasks' meters are closed.
    tasks = conn.execute(
        sa.text(
            "SELECT t.id, t.started_at, t.finished_at, t.last_metrics, t.result FROM tasks t"
            " JOIN jobs j ON j.id = t.job_id WHERE j.status IN ('succeeded', 'failed', 'cancelled')"
        )
    ).all()
    for task_id, started, finished, last_metrics, result in tasks:
        conn.execute(
            TASKS.update()
            .where(TASKS.c.id == task_id)
            .values(
                metered_until=_utc(finished) or _utc(started),
                metered_egress_bytes=_sent(last_metrics, result),
            )
        )


def downgrade() -> None:
    op.create_table(
        "ledger_entries",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("tenant_id", sa.String(length=32), nullable=False),
        sa.Column("task_id", sa.String(length=32), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("region", sa.String(length=64), nullable=False),
        sa.Column("cluster_id", sa.String(length=32), nullable=True),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("quantity", sa.Double(), nullable=False),
        sa.Column("unit_price", sa.Double(), nullable=False),
        sa.Column("amount", sa.Double(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["cluster_id"], ["clusters.id"], name=op.f("fk_ledger_entries_cluster_id_clusters")
        ),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_ledger_entries_job_id_jobs")),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], name=op.f("fk_ledger_entries_task_id_tasks")),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_ledger_entries_tenant_id_tenants")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ledger_entries")),
    )
    with op.batch_alter_table("ledger_entries") as batch:
        batch.create_index(batch.f("ix_ledger_entries_job_id"), ["job_id"], unique=False)
        batch.create_index(batch.f("ix_ledger_entries_tenant_id"), ["tenant_id"], unique=False)
    # One line per task and kind, as the single-entry ledger kept them (the postings' split is lost).
    op.execute(
        "INSERT INTO ledger_entries (job_id, tenant_id, task_id, attempt, region, cluster_id, kind,"
        " quantity, unit_price, amount, created_at)"
        " SELECT job_id, tenant_id, task_id, min(attempt), min(region), min(cluster_id), kind,"
        " sum(quantity), min(unit_price), sum(amount_micros) / 1000000.0, max(created_at)"
        " FROM ledger_transactions GROUP BY job_id, tenant_id, task_id, kind"
    )
    # Plain ALTER TABLE ... DROP COLUMN (SQLite 3.35+): a batch copy of tasks would have to drop
    # the table that allocations, metrics and the restored lines refer to.
    for column in ("metered_egress_bytes", "metered_until", "platform_fee"):
        op.drop_column("tasks", column)
    with op.batch_alter_table("ledger_postings") as batch:
        batch.drop_index(batch.f("ix_ledger_postings_transaction_id"))
        batch.drop_index(batch.f("ix_ledger_postings_account_id"))
    op.drop_table("ledger_postings")
    with op.batch_alter_table("ledger_transactions") as batch:
        batch.drop_index("ix_ledger_transactions_provider_period")
        batch.drop_index("ix_ledger_transactions_tenant_period")
        batch.drop_index(batch.f("ix_ledger_transactions_job_id"))
    op.drop_table("ledger_transactions")
    op.drop_table("ledger_accounts")
