"""Alembic environment: runs migrations online against the URL handed over by ``migrate.alembic_config``."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import context
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

import orchestration.db.models  # noqa: F401  (registers every table on Base.metadata)
from orchestration.db.base import Base
from orchestration.db.engine import is_sqlite, make_engine

config = context.config
target_metadata = Base.metadata
MIGRATION_LOCK_KEY = 0x63706E  # 'cpn'


@contextmanager
def _sqlite_file_lock(url: str) -> Iterator[None]:
    """Replicas migrating one SQLite file take turns on a lock file beside it. Alembic runs each
    SQLite migration in its own transaction and reads the version before the first, so without
    this two processes can both read 0013 and both apply 0014 (the second fails mid-rebuild)."""
    database = make_url(url).database
    if not database or database == ":memory:" or database.startswith("file:"):
        yield  # an in-memory database has a single user
        return
    lock_path = Path(database).expanduser().with_name(Path(database).name + ".migrate-lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def run_migrations_online() -> None:
    url: str = config.attributes["database_url"]
    engine = make_engine(url)
    if is_sqlite(engine):
        with _sqlite_file_lock(url):
            _run(engine)
    else:
        _run(engine)


def _run(engine: Engine) -> None:
    try:
        with engine.connect() as connection:
            context.configure(
                connection=connection,
                target_metadata=target_metadata,
                # SQLite cannot ALTER most things in place; batch mode rebuilds the table instead.
                render_as_batch=is_sqlite(engine),
                compare_type=True,
            )
            with context.begin_transaction():
                if connection.dialect.name == "postgresql":
                    # Replicas starting together migrate one after the other; the later ones find head.
                    connection.execute(
                        text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY}
                    )
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise RuntimeError("offline (SQL script) migrations are not supported; pass a database URL")
run_migrations_online()
