"""Fresh databases at the migrations' head without running the migrations for every test.

Each test process migrates one template per backend once (the real ``upgrade`` from empty) and
every test gets its own copy: a file copy for SQLite, ``CREATE DATABASE ... TEMPLATE`` for
PostgreSQL. A copy is the same schema and rows that migrating would give (test_migrations.py
checks a copy against the models and still migrates from empty itself), in a tenth of the time.
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import sqlite3
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from functools import cache
from pathlib import Path

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from orchestration.db.engine import normalize_url
from orchestration.db.migrate import upgrade

POSTGRES_ADMIN_URL = os.environ.get(
    "CPN_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)


def _admin_engine() -> Engine:
    return create_engine(normalize_url(POSTGRES_ADMIN_URL), isolation_level="AUTOCOMMIT")


def _postgres_url(name: str) -> str:
    return (
        make_url(normalize_url(POSTGRES_ADMIN_URL)).set(database=name).render_as_string(hide_password=False)
    )


@cache
def _sqlite_template() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="cpn-sqlite-template-"))
    atexit.register(shutil.rmtree, folder, True)
    path = folder / "head.sqlite"
    upgrade(f"sqlite:///{path}")
    # The database runs in WAL mode: fold the log into the file so a plain copy holds everything.
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    assert not path.with_name(path.name + "-wal").exists()
    return path


def migrated_sqlite_url(path: Path) -> str:
    """A SQLite database at ``path`` (which must not exist) at head; returns its URL."""
    shutil.copyfile(_sqlite_template(), path)
    return f"sqlite:///{path}"


@cache
def _postgres_template() -> str:
    """Name of this process's template database at head (no one connects to it after this)."""
    name = f"cpn_template_{secrets.token_hex(6)}"
    _create(f'CREATE DATABASE "{name}"')
    atexit.register(drop_postgres_database, _postgres_url(name))
    upgrade(_postgres_url(name))
    return name


def _create(statement: str) -> None:
    admin = _admin_engine()
    try:
        with admin.connect() as conn:
            conn.execute(text(statement))
    finally:
        admin.dispose()


def create_postgres_database(migrated: bool = False) -> str:
    """CREATE DATABASE cpn_test_<hex>, empty or (``migrated``) a copy of the head template;
    returns its URL (psycopg driver)."""
    name = f"cpn_test_{secrets.token_hex(6)}"
    template = f' TEMPLATE "{_postgres_template()}"' if migrated else ""
    _create(f'CREATE DATABASE "{name}"{template}')
    return _postgres_url(name)


def drop_postgres_database(url: str) -> None:
    name = make_url(url).database
    admin = _admin_engine()
    try:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


# Dropping a database takes a checkpoint's worth of I/O; nothing waits for it but the run's end.
_DROPPER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="drop-db")
_DROPS: list[Future[None]] = []


def drop_postgres_database_later(url: str) -> None:
    _DROPS.append(_DROPPER.submit(drop_postgres_database, url))


def finish_drops() -> None:
    """Wait for the pending drops; re-raises the first failure."""
    while _DROPS:
        _DROPS.pop(0).result()
