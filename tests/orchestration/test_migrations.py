"""Migrations reach head on both databases, match the ORM exactly, and go back down cleanly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

import orchestration.db.models  # noqa: F401
from orchestration.db.base import Base
from orchestration.db.engine import make_engine
from orchestration.db.migrate import current_revision, downgrade, head_revision, upgrade

REPO = Path(__file__).resolve().parents[2]


def test_upgrade_reaches_head_and_matches_models(db_url: str) -> None:
    assert current_revision(db_url) == head_revision()
    upgrade(db_url)  # idempotent: every server start runs it
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            diff = compare_metadata(
                MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata
            )
            tables = set(inspect(conn).get_table_names())
    finally:
        engine.dispose()
    assert diff == [], f"models and migrations disagree; add a migration: {diff}"
    assert set(Base.metadata.tables) <= tables


def test_downgrade_to_base_and_back(db_url: str) -> None:
    downgrade(db_url, "base")
    assert current_revision(db_url) is None
    upgrade(db_url)
    assert current_revision(db_url) == head_revision()


def test_concurrent_upgrades_of_a_fresh_database(db_url: str) -> None:
    """Replicas starting at once (separate processes): each migrates or finds head, none fails."""
    downgrade(db_url, "base")
    code = "import sys; from orchestration.db.migrate import upgrade; upgrade(sys.argv[1])"
    procs = [
        subprocess.Popen([sys.executable, "-c", code, db_url], cwd=REPO, stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    failures = [err for p in procs if (err := p.communicate(timeout=120)[1]) and p.returncode != 0]
    assert not failures, failures
    assert current_revision(db_url) == head_revision()
