"""Engines and sessions for the two supported databases: SQLite (embedded) and PostgreSQL (psycopg 3)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from contracts.errors import InvalidArgument

SQLITE_BUSY_TIMEOUT_MS = 30_000


def normalize_url(url: str) -> str:
    """Pin PostgreSQL URLs to the psycopg 3 driver; refuse databases this project does not support."""
    try:
        parsed = make_url(url)
    except Exception as exc:  # sqlalchemy raises ArgumentError with a terse message
        raise InvalidArgument(f"database_url is not a valid SQLAlchemy URL: {url!r}") from exc
    if parsed.drivername in ("postgres", "postgres+psycopg"):  # the scheme many hosting providers hand out
        parsed = parsed.set(drivername="postgresql+psycopg")
    backend = parsed.get_backend_name()
    if backend == "postgresql":
        if parsed.drivername != "postgresql+psycopg":
            parsed = parsed.set(drivername="postgresql+psycopg")
        return parsed.render_as_string(hide_password=False)
    if backend == "sqlite":
        return url
    raise InvalidArgument(f"database_url: unsupported database {backend!r} (use sqlite or postgresql)")


def is_sqlite(url_or_engine: str | Engine) -> bool:
    url = url_or_engine.url if isinstance(url_or_engine, Engine) else make_url(url_or_engine)
    return url.get_backend_name() == "sqlite"


def make_engine(url: str, **kwargs: Any) -> Engine:
    """Create an engine. SQLite gets WAL, foreign keys, a busy timeout and ``BEGIN IMMEDIATE``
    transactions (writers queue on the file lock instead of failing on a read-to-write upgrade)."""
    url = normalize_url(url)
    if not is_sqlite(url):
        # Pre-ping costs a loopback round trip per checkout, but without it a connection PostgreSQL
        # dropped (a restart, a failover) fails the request that drew it with a 5xx.
        kwargs.setdefault("pool_pre_ping", True)
        # Sync REST handlers run on up to 40 worker threads, beside the gRPC edge and the leader's
        # loops: SQLAlchemy's default of 5 (+10 overflow) queued concurrent requests for a connection.
        kwargs.setdefault("pool_size", 10)
        kwargs.setdefault("max_overflow", 30)
        return create_engine(url, **kwargs)

    connect_args: dict[str, Any] = {"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}
    connect_args.update(kwargs.pop("connect_args", {}))
    database = make_url(url).database
    if not database or database == ":memory:":
        # One shared connection, or every pooled connection would see its own empty database.
        kwargs.setdefault("poolclass", StaticPool)
    elif not database.startswith("file:"):
        Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args=connect_args, **kwargs)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control away from the sqlite3 module; the "begin" hook below issues BEGIN.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    # expire_on_commit=False: rows returned from a committed unit of work stay readable by callers.
    return sessionmaker(bind=engine, expire_on_commit=False)


@contextmanager
def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """One unit of work: commit on success, roll back on any exception, always close."""
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def as_utc(value: datetime) -> datetime:
    """SQLite hands DateTime(timezone=True) columns back naive (they were stored as UTC): make them aware."""
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
