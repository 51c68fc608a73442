"""The dashboard's queries on SQLite and PostgreSQL: the queue's order, the ledger's totals by
tenant and by provider, and tenants' keys without their hashes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from orchestration.db.models import (
    ApiKey,
    Cluster,
    Job,
    LedgerPosting,
    LedgerTransaction,
    Provider,
    Region,
    Tenant,
)
from orchestration.ledger.accounts import account_ids
from orchestration.ledger.postings import charge_postings, provider_account, tenant_account
from service_layer.dashboard.costs import NO_PROVIDER, grand_total, ledger_totals
from service_layer.dashboard.queue import queue_rows
from service_layer.dashboard.tenants import tenant_rows

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def _seed(session: Session) -> dict[str, str]:
    a, b = Tenant(name="alpha"), Tenant(name="beta")
    p1, p2 = Provider(name="lumen"), Provider(name="nordic")
    session.add_all([a, b, p1, p2, Region(name="eu-west")])
    session.flush()
    c1 = Cluster(name="paris-1", region="eu-west", provider_id=p1.id)
    c2 = Cluster(name="paris-2", region="eu-west", provider_id=p2.id)
    session.add_all([c1, c2])

    def job(tenant: Tenant, name: str, status: str, at: timedelta, **kw: Any) -> Job:
        return Job(tenant_id=tenant.id, name=name, spec={}, status=status, created_at=T0 + at, **kw)

    jobs = {
        "old": job(b, "old", "queued", timedelta(0), reason="r1"),
        "new": job(a, "new", "queued", timedelta(seconds=5), priority=5),
        "mid": job(a, "mid", "queued", timedelta(seconds=2), deferred="devices contended", queue_position=1),
        "ran": job(a, "ran", "succeeded", timedelta(hours=-1)),
        "ran2": job(a, "ran2", "failed", timedelta(hours=-1)),
        "ran3": job(b, "ran3", "succeeded", timedelta(hours=-1)),
    }
    session.add_all(jobs.values())
    session.flush()
    lines = [
        (jobs["ran"], c1, "gpu", 2.0, 4.0),
        (jobs["ran"], c1, "egress", 1.0, 0.1),
        (jobs["ran2"], c2, "gpu", 1.0, 3.0),
        (jobs["ran3"], None, "gpu", 1.0, 1.0),
    ]
    for n, (job, cluster, kind, qty, amount) in enumerate(lines):
        provider = {c1.id: "lumen", c2.id: "nordic"}.get(cluster.id) if cluster else ""
        tx = LedgerTransaction(
            kind=kind,
            job_id=job.id,
            tenant_id=job.tenant_id,
            provider=provider or "",
            cluster_id=cluster.id if cluster else None,
            quantity=qty,
            unit_price=amount / qty,
            amount_micros=round(amount * 1e6),
            period_start=T0,
            period_end=T0 + timedelta(hours=1),
            meter_from=n,
        )
        session.add(tx)
        session.flush()
        postings = charge_postings(
            kind,
            tx.amount_micros,
            0.1,
            tenant=tenant_account(job.tenant_id),
            provider=provider_account(provider or "x"),
        )
        ids = account_ids(session, [name for name, _ in postings])
        session.add_all(
            LedgerPosting(transaction_id=tx.id, account_id=ids[a], amount_micros=m) for a, m in postings
        )
    session.add(ApiKey(tenant_id=a.id, prefix="cpn_abcd", key_hash="h" * 64))
    return {k: j.id for k, j in jobs.items()}


def test_queue_costs_and_tenants_read_the_database(session_factory: sessionmaker[Session]) -> None:
    with session_factory() as session, session.begin():
        ids = _seed(session)
    with session_factory() as session:
        rows = queue_rows(session)
        by_tenant = ledger_totals(session, "tenant")
        by_provider = ledger_totals(session, "provider")
        tenants = tenant_rows(session)
    # the placer's ranked positions first, then jobs it has not ranked yet by priority and age
    assert [(r.position, r.job_id) for r in rows] == [(1, ids["mid"]), (2, ids["new"]), (3, ids["old"])]
    assert [r.tenant for r in rows] == ["alpha", "alpha", "beta"]
    assert [r.priority for r in rows] == [0, 5, 0]
    assert [r.reason for r in rows] == ["devices contended", "waiting for the placer", "r1"]

    alpha, beta = by_tenant
    assert (alpha.name, alpha.jobs, alpha.lines) == ("alpha", 2, 3)
    assert (alpha.device_hours, alpha.gpu, alpha.egress_gb) == (
        pytest.approx(3.0),
        pytest.approx(7.0),
        pytest.approx(1.0),
    )
    assert alpha.total == pytest.approx(7.1) and beta.total == pytest.approx(1.0) and beta.jobs == 1
    assert [(t.name, t.jobs, round(t.total, 6)) for t in by_provider] == [
        ("lumen", 1, 4.1),
        ("nordic", 1, 3.0),
        (NO_PROVIDER, 1, 1.0),
    ]
    assert grand_total(by_tenant).total == pytest.approx(grand_total(by_provider).total) == pytest.approx(8.1)
    assert grand_total(by_tenant).lines == 4

    (a, b) = tenants
    assert (a.name, a.jobs, a.active_keys, b.keys) == ("alpha", 4, 1, ())
    assert a.keys[0].prefix == "cpn_abcd" and not hasattr(a.keys[0], "key_hash")
