"""A real job's bill: `cpn agent` processes in two regions run torchrun workers on the control plane
(PostgreSQL + Redis), the leader meters the tasks while they run, and at the end the tenant's
invoice equals the job's actual cost and the providers' statements pay that less the fees."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from service_layer.cli.local_fleet import LocalAgent, stop_agents
from service_layer.server import ServerHandle, start_server_in_thread
from tests.conftest import (
    create_postgres_database,
    drop_postgres_database,
    postgres_unreachable,
    redis_unreachable,
    settings_for,
)
from tests.integration.test_end_to_end import TERMINAL, job_spec, launch, wait_job

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(600)]


@pytest.fixture
def metered_control_plane(tmp_path: Path) -> Iterator[tuple[ServerHandle, httpx.Client]]:
    for reason in (postgres_unreachable(), redis_unreachable()):
        if reason:
            pytest.skip(reason)
    url = create_postgres_database()
    admin_key = "cpn_admin_" + secrets.token_urlsafe(16)
    settings = settings_for(
        url, data_dir=tmp_path, http_port=0, grpc_port=0, admin_api_key=admin_key,
        heartbeat_interval_s=1.0, heartbeat_misses=3, ledger_meter_interval_s=0.5, platform_fee=0.15,
    )  # fmt: skip
    handle = start_server_in_thread(settings)
    client = httpx.Client(
        base_url=handle.http_url, headers={"Authorization": f"Bearer {admin_key}"}, timeout=30
    )
    try:
        yield handle, client
    finally:
        client.close()
        handle.stop()
        drop_postgres_database(url)


def _get(client: httpx.Client, path: str, **params: Any) -> Any:
    return client.get(path, params=params).raise_for_status().json()


def test_a_real_jobs_invoice_and_statements_match_its_cost(
    metered_control_plane: Any, tmp_path: Path
) -> None:
    handle, client = metered_control_plane
    specs = [
        LocalAgent("eu-west", "paris-1", "lumen", 1.0, "EU", measure_profile=False),
        LocalAgent("us-east", "virginia-1", "atlas", 2.0, "US", measure_profile=False),
    ]
    procs = launch(handle, client, specs, tmp_path)
    try:
        job = (
            client.post("/v1/jobs", json={"spec": job_spec(60), "choice": "cheapest"})
            .raise_for_status()
            .json()
        )
        done = wait_job(client, job["id"], TERMINAL, timeout_s=240)
    finally:
        stop_agents(procs)
    assert done["status"] == "succeeded", done["reason"]
    assert {t["region"] for t in done["tasks"]} == {"eu-west", "us-east"}

    txs = _get(client, "/v1/ledger/transactions", job_id=job["id"], limit=1000)["transactions"]
    gpu = [tx for tx in txs if tx["kind"] == "gpu"]
    assert len(gpu) > len(done["tasks"]), "tasks were metered while they ran, not only at their end"
    assert {tx["kind"] for tx in txs} == {"gpu", "egress"}  # the leaders' WAN bytes, billed
    for tx in txs:
        assert sum(Decimal(p["amount"]) for p in tx["postings"]) == 0
    cost = Decimal(str(done["actual_cost"]))
    assert sum(Decimal(tx["amount"]) for tx in txs) == cost > 0

    (me,) = [t for t in _get(client, "/v1/tenants") if t["is_admin"]]
    months = sorted({tx["period_start"][:7] for tx in txs})
    invoiced = sum(Decimal(_get(client, f"/v1/tenants/{me['id']}/invoice", month=m)["total"]) for m in months)
    assert invoiced == cost  # the tenant is invoiced exactly the job's actual cost

    egress = sum(Decimal(tx["amount"]) for tx in txs if tx["kind"] == "egress")
    gross = fees = payout = Decimal(0)
    for provider in ("lumen", "atlas"):
        for m in months:
            st = _get(client, f"/v1/providers/{provider}/statement", month=m)
            assert Decimal(st["payout"]) == Decimal(st["gross"]) - Decimal(st["fees"])
            gross += Decimal(st["gross"])
            fees += Decimal(st["fees"])
            payout += Decimal(st["payout"])
    assert gross == cost - egress  # the providers' statements cover every device-time charge
    assert payout == cost - egress - fees  # ... and pay it less the platform's fees
    assert abs(fees - gross * Decimal("0.15")) <= Decimal("0.000001") * len(gpu)
