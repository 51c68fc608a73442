"""Every calibration kind fits the tables that store it, on PostgreSQL too (which enforces the
column's width where SQLite does not: a kind that outgrew it failed every job's end there)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

import control_layer.calibration as cal
from orchestration.db.models import Job, Tenant
from orchestration.db.models.calibration import CalibrationChange, CalibrationFactor

# The calibration module names each kind it learns as an upper-case string constant.
KINDS = sorted({v for k, v in vars(cal).items() if k.isupper() and isinstance(v, str)})


def test_the_kinds_are_found() -> None:
    assert {"efficiency", "checkpoint_fixed_s", "exchange_drift_fixed_s"} <= set(KINDS)


def test_every_kind_is_stored_and_read_back(session_factory: sessionmaker[Session]) -> None:
    key = "f" * 32  # a node id's length
    with session_factory.begin() as s:
        job_id = _a_job(s)
        for kind in KINDS:
            s.add(CalibrationFactor(kind=kind, key=key, value=1.0, runs=1))
            s.add(CalibrationChange(job_id=job_id, kind=kind, key=key, new=1.0, observed=1.0))
    with session_factory() as s:
        assert sorted(s.scalars(select(CalibrationFactor.kind))) == KINDS
        assert sorted(s.scalars(select(CalibrationChange.kind))) == KINDS


def _a_job(s: Session) -> str:
    tenant = Tenant(name="kinds")
    s.add(tenant)
    s.flush()
    job = Job(tenant_id=tenant.id, name="kinds", spec={})
    s.add(job)
    s.flush()
    return job.id
