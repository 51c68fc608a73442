"""Every REST operation under a fuzzer (schemathesis, from the server's own OpenAPI document), on
PostgreSQL where a value the database cannot hold fails at commit: with an empty fleet and with
nodes registered. No request may get a 5xx, and every answer must match the schema.

The budget is fixed (``EXAMPLES`` per operation, derandomized), so a run is repeatable and its
time is bounded: the same cases every run, found again if a fix is undone.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from service_layer.client import CpnClient
from service_layer.server import ServerHandle, start_server_in_thread
from tests.conftest import (
    create_postgres_database,
    drop_postgres_database,
    postgres_unreachable,
    redis_unreachable,
    settings_for,
)
from tests.service_layer.harness import seed_fleet

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

EXAMPLES = 12  # per operation and fleet: ~900 requests in all


@pytest.fixture(scope="module", params=["empty fleet", "nodes registered"])
def fuzzed(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    for reason in (postgres_unreachable(), redis_unreachable()):
        if reason:
            pytest.skip(reason)
    url = create_postgres_database(migrated=True)
    admin_key = "cpn_admin_" + secrets.token_urlsafe(16)
    tmp: Path = tmp_path_factory.mktemp("fuzz")
    settings_ = settings_for(
        url, data_dir=tmp, http_port=0, grpc_port=0, admin_api_key=admin_key,
        heartbeat_interval_s=30.0, heartbeat_misses=20,
    )  # fmt: skip
    handle = start_server_in_thread(settings_)
    try:
        if request.param == "nodes registered":
            with CpnClient(handle.http_url, admin_key) as admin:
                seed_fleet(handle, admin)
        yield {"server": handle, "headers": {"Authorization": f"Bearer {admin_key}"}}
    finally:
        handle.stop()
        drop_postgres_database(url)


@pytest.fixture(scope="module")
def api_schema(fuzzed: dict[str, Any]) -> Any:
    server: ServerHandle = fuzzed["server"]
    return schemathesis.openapi.from_url(server.http_url + "/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
def test_no_request_gets_a_5xx_or_an_answer_outside_the_schema(case: Any, fuzzed: dict[str, Any]) -> None:
    case.call_and_validate(
        headers=fuzzed["headers"], checks=[not_a_server_error, response_schema_conformance], timeout=60
    )
