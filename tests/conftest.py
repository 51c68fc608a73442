"""Shared fixtures: a fresh migrated database per test on SQLite and on PostgreSQL, a bus on both
backends, and a ServerContext wired to them.

PostgreSQL and Redis are real servers (CPN_TEST_POSTGRES_URL, CPN_TEST_REDIS_URL; local defaults).
Their tests are skipped only when the server cannot be reached, with the reason saying so.
"""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session, sessionmaker

from orchestration.bus import Bus, InProcessBus, RedisBus
from orchestration.context import ServerContext
from orchestration.db.engine import make_engine, make_session_factory, normalize_url
from orchestration.settings import Settings
from tests import ast_guard
from tests.dbtemplate import (
    POSTGRES_ADMIN_URL,
    create_postgres_database,
    drop_postgres_database_later,
    finish_drops,
    migrated_sqlite_url,
)
from tests.dbtemplate import (
    drop_postgres_database as drop_postgres_database,  # for the tests that make their own
)

ast_guard.install()  # an interpreter bug some parses meet beside threads (tests/ast_guard.py)

REDIS_URL = os.environ.get("CPN_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

# No per-example deadline: on a busy machine one example can take 10x its usual time, and a test
# asserts outcomes, not wall-clock bounds (hypothesis's default fails an example over 200 ms).
hypothesis_settings.register_profile("cpn", deadline=None)
hypothesis_settings.load_profile("cpn")


@cache
def postgres_unreachable() -> str | None:
    """None when PostgreSQL answers, else why not (checked once per run)."""
    try:
        engine = create_engine(normalize_url(POSTGRES_ADMIN_URL), connect_args={"connect_timeout": 3})
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        engine.dispose()
        return None
    except Exception as exc:
        return f"PostgreSQL unreachable at {POSTGRES_ADMIN_URL}: {exc.__class__.__name__}: {exc}"


@cache
def redis_unreachable() -> str | None:
    try:
        bus = RedisBus(REDIS_URL)
        try:
            bus.ping()
        finally:
            bus.close()
        return None
    except Exception as exc:
        return f"Redis unreachable at {REDIS_URL}: {exc.__class__.__name__}: {exc}"


# Tests that start real agents (they bind fixed sync-port ranges) or shape network namespaces, and
# every multi-process test, run one after another on one xdist worker (``--dist loadgroup``): the
# other workers take the rest meanwhile. They wait on heartbeats, timeouts and peers, so a group
# of them on one worker keeps the contention it adds bounded.
SERIAL_PATHS = (
    "tests/agent/",
    "tests/integration/",
    "tests/benchmarks/test_link_probe.py",
    "tests/benchmarks/test_netlab.py",
    "tests/resource_layer/test_tls.py",
    "tests/slurm/",
    "tests/service_layer/test_job_logs_agent.py",
    "tests/training/test_lost_notices.py",
    "tests/training/test_outputs.py",
    "tests/training/test_sync_engine.py",
)

# Of those, whole jobs through a control plane and its agents, and the cross-region worker tests,
# run one after another in a group of their own beside the serial one: the jobs' agents bind
# sync-port blocks from 31000 up (the serial group's below 31000), the workers only ports the
# kernel picks; neither group shapes namespaces the other uses or runs Slurm. (The two groups'
# lengths are about equal; the rest fill the third worker and the gaps.)
JOBS_GROUP_PATHS = ("tests/integration/", "tests/training/test_sync_workers.py")

# Slow multi-process tests that assert only results (equal losses and parameters), never timing
# or liveness: they run beside the serial group rather than lengthen it.
BESIDE_OTHERS = ("tests/training/test_parallel_equivalence.py",)


# What ``--quick`` leaves out: whatever needs a service, a browser, root or several processes (the
# serial group, and these modules, which start workers or servers as processes).
NOT_QUICK_MARKS = ("slow", "postgres", "redis", "browser")
PROCESS_PATHS = (
    "tests/benchmarks/test_plan_executes_groups.py",
    "tests/control_layer/test_worker_configs_run.py",
    "tests/service_layer/test_server_process.py",
    "tests/service_layer/test_server_workers.py",
    "tests/training/test_checkpoint_mirror.py",
    "tests/training/test_launch.py",
    "tests/training/test_reference_startup.py",
    "tests/training/test_sync_example.py",
    "tests/training/test_sync_grad_workers.py",
    "tests/training/test_sync_hierarchical_workers.py",
    "tests/training/test_sync_workers.py",
    "tests/training/test_wire_count.py",
    "tests/training/test_worker.py",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--quick",
        action="store_true",
        help="only the pure and single-process tests: no PostgreSQL, Redis, browser, root or agents",
    )


def pytest_configure(config: pytest.Config) -> None:
    # xdist hands its workers the controller's terminal size as COLUMNS/LINES; the CLI's rich
    # consoles, made at import, would fix their width to it, and the CLI tests that set COLUMNS
    # per invocation would get 80 columns instead.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.pop("COLUMNS", None)
        os.environ.pop("LINES", None)


def quick(item: pytest.Item) -> bool:
    if item.nodeid.startswith(SERIAL_PATHS + BESIDE_OTHERS + PROCESS_PATHS):
        return False
    callspec = getattr(item, "callspec", None)
    if callspec is not None and callspec.params.get("db_url") == "postgres":
        return False
    return not any(item.get_closest_marker(m) for m in NOT_QUICK_MARKS)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--quick"):
        kept = [i for i in items if quick(i)]
        config.hook.pytest_deselected(items=[i for i in items if not quick(i)])
        items[:] = kept
    for item in items:
        if item.nodeid.startswith(BESIDE_OTHERS):
            continue
        if item.get_closest_marker("slow") or item.nodeid.startswith(SERIAL_PATHS):
            group = "jobs" if item.nodeid.startswith(JOBS_GROUP_PATHS) else "serial"
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # One intra-op thread in the test processes: the xdist workers already fill the cores, and with
    # more threads than free cores OpenMP's waits make a tiny model's step tens of times slower on a
    # busy host (a 1-layer calibration: 15 s with 2 threads beside other work, 0.3 s with one).
    # Processes the tests start choose their own threads, as the product's do.
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != 1:
        torch.set_num_threads(1)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    finish_drops()


def _require(reason: str | None) -> None:
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """URL of a fresh database migrated to head; dropped (PostgreSQL) or deleted with tmp_path."""
    if request.param == "sqlite":
        yield migrated_sqlite_url(tmp_path / "cpn.sqlite")
        return
    _require(postgres_unreachable())
    url = create_postgres_database(migrated=True)
    try:
        yield url
    finally:
        drop_postgres_database_later(url)


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    eng = make_engine(db_url)
    yield eng
    eng.dispose()


@pytest.fixture
def session_factory(engine: Engine) -> sessionmaker[Session]:
    return make_session_factory(engine)


def make_redis_bus() -> RedisBus:
    """A RedisBus under a random prefix so concurrent runs never see each other's keys or channels."""
    return RedisBus(REDIS_URL, prefix=f"cpntest:{secrets.token_hex(6)}:")


@pytest.fixture(params=["inprocess", pytest.param("redis", marks=pytest.mark.redis)])
def bus(request: pytest.FixtureRequest) -> Iterator[Bus]:
    if request.param == "inprocess":
        b: Bus = InProcessBus()
        yield b
        b.close()
        return
    _require(redis_unreachable())
    rb = make_redis_bus()
    yield rb
    rb.delete_prefixed()
    rb.close()


def settings_for(db_url: str, **overrides: object) -> Settings:
    """Settings for a test control plane: fast heartbeats, Redis alongside PostgreSQL."""
    values: dict[str, object] = {
        "environment": "development",
        "database_url": db_url,
        "redis_url": REDIS_URL if not db_url.startswith("sqlite") else None,
        "heartbeat_interval_s": 0.2,
        "heartbeat_misses": 2,
        "max_job_retries": 2,
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


@pytest.fixture
def ctx(db_url: str, session_factory: sessionmaker[Session], tmp_path: Path) -> Iterator[ServerContext]:
    """SQLite runs with the in-process bus, PostgreSQL with Redis: the two deployments cpn supports.
    Files (the embedded artifact store's) go under the test's own directory."""
    settings = settings_for(db_url, data_dir=tmp_path / "data")
    if settings.redis_url:
        _require(redis_unreachable())
        bus: Bus = make_redis_bus()
    else:
        bus = InProcessBus()
    yield ServerContext(settings=settings, session_factory=session_factory, bus=bus)
    if isinstance(bus, RedisBus):
        bus.delete_prefixed()
    bus.close()
