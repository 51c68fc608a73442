"""Engines for both databases: URL handling, SQLite pragmas, unit-of-work semantics."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from contracts.errors import InvalidArgument
from orchestration.db.engine import make_engine, make_session_factory, normalize_url, session_scope
from orchestration.db.models import Node, Region


def test_urls_are_pinned_to_supported_drivers() -> None:
    assert normalize_url("postgresql://u:p%40ss@h:5432/db") == "postgresql+psycopg://u:p%40ss@h:5432/db"
    assert normalize_url("postgres://h/db") == "postgresql+psycopg://h/db"
    assert normalize_url("sqlite:///x.sqlite") == "sqlite:///x.sqlite"
    with pytest.raises(InvalidArgument, match="unsupported database 'mysql'"):
        normalize_url("mysql://h/db")
    with pytest.raises(InvalidArgument, match="not a valid"):
        normalize_url("::nonsense::")


def test_sqlite_file_gets_wal_foreign_keys_and_its_directory(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'deep' / 'dir' / 'cpn.sqlite'}")
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30_000
    finally:
        engine.dispose()
    assert (tmp_path / "deep" / "dir" / "cpn.sqlite").exists()


def test_session_scope_commits_or_rolls_back(session_factory: sessionmaker[Session]) -> None:
    with session_scope(session_factory) as s:
        s.add(Region(name="eu-west", jurisdiction="EU"))
    with pytest.raises(RuntimeError), session_scope(session_factory) as s:
        s.add(Region(name="us-east"))
        s.flush()
        raise RuntimeError("abort the unit of work")
    with session_scope(session_factory) as s:
        assert s.scalars(select(Region.name)).all() == ["eu-west"]


def test_foreign_keys_are_enforced(session_factory: sessionmaker[Session]) -> None:
    with pytest.raises(IntegrityError), session_scope(session_factory) as s:
        s.add(Node(cluster_id="no-such-cluster", token_hash="x"))


def test_engine_fixture_reaches_the_right_backend(engine: Engine, db_url: str) -> None:
    with engine.connect() as conn:
        assert conn.execute(text("SELECT 1")).scalar() == 1
    assert engine.dialect.name == ("sqlite" if db_url.startswith("sqlite") else "postgresql")
    assert make_session_factory(engine).kw["expire_on_commit"] is False
