"""Alembic environment: runs migrations online against the URL handed over by ``migrate.alembic_config``."""

from __future__ import annotations

from alembic import context
from sqlalchemy import text

import orchestration.db.models  # noqa: F401  (registers every table on Base.metadata)
from orchestration.db.base import Base
from orchestration.db.engine import is_sqlite, make_engine

config = context.config
target_metadata = Base.metadata
MIGRATION_LOCK_KEY = 0x63706E  # 'cpn'


def run_migrations_online() -> None:
    url: str = config.attributes["database_url"]
    engine = make_engine(url)
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
