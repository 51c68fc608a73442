"""Accounts (made on demand) and the posting of one charge as a balanced transaction."""

from __future__ import annotations

from sqlalchemy import insert, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from orchestration.db.base import utcnow
from orchestration.db.models import LedgerAccount, LedgerPosting, LedgerTransaction, Task
from orchestration.ledger.postings import (
    Charge,
    account_kind,
    charge_postings,
    provider_account,
    tenant_account,
)


def account_ids(session: Session, names: list[str]) -> dict[str, int]:
    """Ids of the named accounts, creating the missing ones. Two transactions creating the same
    account at once both succeed: the insert skips a name another has just taken."""
    wanted = sorted(set(names))
    found = dict(
        session.execute(
            select(LedgerAccount.name, LedgerAccount.id).where(LedgerAccount.name.in_(wanted))
        ).all()
    )
    missing = [n for n in wanted if n not in found]
    if missing:
        dialect = session.get_bind().dialect.name
        upsert = pg_insert if dialect == "postgresql" else sqlite_insert
        now = utcnow()
        session.execute(
            upsert(LedgerAccount)
            .values([{"name": n, "kind": account_kind(n), "created_at": now} for n in missing])
            .on_conflict_do_nothing(index_elements=["name"])
        )
        found.update(
            session.execute(
                select(LedgerAccount.name, LedgerAccount.id).where(LedgerAccount.name.in_(missing))
            ).all()
        )
    return found


def post_charge(
    session: Session, *, task: Task, tenant_id: str, provider: str, charge: Charge
) -> LedgerTransaction:
    """Write one charge of ``task`` as a transaction and its postings (which sum to zero)."""
    postings = charge_postings(
        charge.kind,
        charge.amount_micros,
        task.platform_fee,
        tenant=tenant_account(tenant_id),
        provider=provider_account(provider),
    )
    assert sum(amount for _, amount in postings) == 0, postings
    ids = account_ids(session, [name for name, _ in postings])
    tx = LedgerTransaction(
        kind=charge.kind,
        job_id=task.job_id,
        task_id=task.id,
        tenant_id=tenant_id,
        provider=provider,
        region=task.region,
        cluster_id=task.cluster_id,
        attempt=task.attempt,
        quantity=charge.quantity,
        unit_price=charge.unit_price,
        amount_micros=charge.amount_micros,
        fee_rate=task.platform_fee if charge.kind == "gpu" else 0.0,
        period_start=charge.period_start,
        period_end=charge.period_end,
        meter_from=charge.meter_from,
    )
    session.add(tx)
    session.flush()
    session.execute(
        insert(LedgerPosting),
        [
            {"transaction_id": tx.id, "account_id": ids[name], "amount_micros": amount}
            for name, amount in postings
        ],
    )
    return tx
