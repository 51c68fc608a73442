"""The costs page's data: what the ledger holds, by tenant and by provider.

``ledger_totals`` is the one query the page reads the ledger through: the charges summed in the
database per tenant, or per provider whose cluster earned them (egress is booked on the sending
task's cluster, so its provider's region sent it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from orchestration.db.models import Cluster, LedgerEntry, Provider, Tenant

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
    """Charges per tenant or per provider, biggest total first."""
    gpu = LedgerEntry.kind == "gpu"

    def part(column: Any, when: Any) -> Any:
        return func.coalesce(func.sum(case((when, column), else_=0.0)), 0.0)

    name = Tenant.name if by == "tenant" else func.coalesce(Provider.name, NO_PROVIDER)
    query = select(
        name,
        func.count(func.distinct(LedgerEntry.job_id)),
        func.count(LedgerEntry.id),
        part(LedgerEntry.quantity, gpu),
        part(LedgerEntry.amount, gpu),
        part(LedgerEntry.quantity, ~gpu),
        part(LedgerEntry.amount, ~gpu),
    )
    if by == "tenant":
        query = query.join(Tenant, Tenant.id == LedgerEntry.tenant_id)
    else:
        query = query.select_from(LedgerEntry).outerjoin(Cluster, Cluster.id == LedgerEntry.cluster_id)
        query = query.outerjoin(Provider, Provider.id == Cluster.provider_id)
    rows = session.execute(query.group_by(name)).all()
    out = [
        Total(str(n), int(j), int(c), float(dh), float(g), float(eg), float(e))
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
