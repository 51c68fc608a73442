"""The costs page's data: what the ledger holds, by tenant and by provider.

``ledger_totals`` is the one query the page reads the ledger through: the charges' transactions
summed in the database per tenant, or per provider whose task ran (device time) or sent (egress)
them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from orchestration.db.models import LedgerTransaction, Tenant

MICROS = 1_000_000  # the ledger keeps money in micro-units

NO_PROVIDER = "(no cluster)"


@dataclass(frozen=True)
class Total:
    name: str
    jobs: int
    lines: int
    device_hours: float
    gpu: float
    egress_gb: float
    egress: float

    @property
    def total(self) -> float:
        return self.gpu + self.egress


def ledger_totals(session: Session, by: Literal["tenant", "provider"]) -> list[Total]:
    """Charges per tenant or per provider, biggest total first (the transactions' tenant-side
    amounts: what tenants were charged, on the provider whose task ran or sent it)."""
    tx = LedgerTransaction
    gpu = tx.kind == "gpu"

    def part(column: Any, when: Any) -> Any:
        return func.coalesce(func.sum(case((when, column), else_=0)), 0)

    name = Tenant.name if by == "tenant" else func.coalesce(func.nullif(tx.provider, ""), NO_PROVIDER)
    query = select(
        name,
        func.count(func.distinct(tx.job_id)),
        func.count(tx.id),
        part(tx.quantity, gpu),
        part(tx.amount_micros, gpu),
        part(tx.quantity, ~gpu),
        part(tx.amount_micros, ~gpu),
    )
    query = query.join(Tenant, Tenant.id == tx.tenant_id) if by == "tenant" else query.select_from(tx)
    rows = session.execute(query.group_by(name)).all()
    out = [
        Total(str(n), int(j), int(c), float(dh), int(g) / MICROS, float(eg), int(e) / MICROS)
        for n, j, c, dh, g, eg, e in rows
    ]
    return sorted(out, key=lambda t: (-t.total, t.name))


def grand_total(rows: Iterable[Total]) -> Total:
    rows = list(rows)
    return Total(
        "total",
        sum(r.jobs for r in rows),
        sum(r.lines for r in rows),
        sum(r.device_hours for r in rows),
        sum(r.gpu for r in rows),
        sum(r.egress_gb for r in rows),
        sum(r.egress for r in rows),
    )
