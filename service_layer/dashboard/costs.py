"""The costs page's data: what the ledger holds, by tenant and by provider.

``ledger_lines`` is the one query the page reads the ledger through: every charge with its
tenant and the provider whose cluster earned it. The totals are pure sums over those lines.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestration.db.models import Cluster, LedgerEntry, Provider, Tenant

NO_PROVIDER = "(no cluster)"


@dataclass(frozen=True)
class Line:
    tenant: str
    provider: str
    job_id: str
    kind: str  # gpu | egress
    quantity: float  # device-hours or GB
    amount: float


@dataclass(frozen=True)
class Total:
    name: str
    jobs: int
    device_hours: float
    gpu: float
    egress_gb: float
    egress: float

    @property
    def total(self) -> float:
        return self.gpu + self.egress


def ledger_lines(session: Session) -> list[Line]:
    rows = session.execute(
        select(
            Tenant.name,
            Provider.name,
            LedgerEntry.job_id,
            LedgerEntry.kind,
            LedgerEntry.quantity,
            LedgerEntry.amount,
        )
        .join(Tenant, Tenant.id == LedgerEntry.tenant_id)
        .outerjoin(Cluster, Cluster.id == LedgerEntry.cluster_id)
        .outerjoin(Provider, Provider.id == Cluster.provider_id)
        .order_by(LedgerEntry.id)
    ).all()
    return [Line(t, p or NO_PROVIDER, j, k, float(q), float(a)) for t, p, j, k, q, a in rows]


def totals(lines: Iterable[Line], by: str) -> list[Total]:
    """Per tenant (``by="tenant"``) or provider (``by="provider"``), biggest total first."""
    jobs: dict[str, set[str]] = defaultdict(set)
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for ln in lines:
        key = ln.tenant if by == "tenant" else ln.provider
        jobs[key].add(ln.job_id)
        s = sums[key]
        if ln.kind == "gpu":
            s[0] += ln.quantity
            s[1] += ln.amount
        else:
            s[2] += ln.quantity
            s[3] += ln.amount
    out = [Total(k, len(jobs[k]), *v) for k, v in sums.items()]
    return sorted(out, key=lambda t: (-t.total, t.name))


def grand_total(rows: Iterable[Total]) -> Total:
    rows = list(rows)
    return Total(
        "total",
        sum(r.jobs for r in rows),
        sum(r.device_hours for r in rows),
        sum(r.gpu for r in rows),
        sum(r.egress_gb for r in rows),
        sum(r.egress for r in rows),
    )
