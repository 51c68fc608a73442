"""The queue and quotas over REST and the CLI, on a real control plane: a job over its tenant's
device quota answers 201 queued with its position and reason, `GET /v1/queue` shows each tenant its
own entries (an admin all), and a submission over the monthly spend cap is a 402 naming the numbers."""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from cpn.cli import app
from service_layer.client import ApiError, CpnClient
from service_layer.server import ServerHandle
from tests.service_layer.harness import ADMIN_KEY, count_rows, new_tenant, seed_fleet, small_spec


def _status(call) -> ApiError:
    with pytest.raises(ApiError) as info:
        call()
    return info.value


def test_queue_quota_and_spend_cap(server: ServerHandle, admin: CpnClient) -> None:
    seed_fleet(server, admin)  # four devices in two regions
    alice_row, alice = new_tenant(admin, server, "alice")
    bob_row, bob = new_tenant(admin, server, "bob")

    # quotas: admin only, bounded, the tenant must exist
    assert (
        _status(lambda: alice.set_quota(alice_row["id"], max_devices=1, max_monthly_spend=None)).status == 403
    )
    assert _status(lambda: admin.set_quota("nobody", max_devices=1, max_monthly_spend=None)).status == 404
    bad = _status(lambda: admin.set_quota(alice_row["id"], max_devices=-1, max_monthly_spend=None))
    assert bad.status == 422 and "max_devices" in bad.message
    infinite = admin._http.put(
        f"/v1/tenants/{alice_row['id']}/quota",
        content=b'{"max_devices": 1, "max_monthly_spend": 1e999}',
        headers={"content-type": "application/json"},
    )
    assert infinite.status_code == 422 and "max_monthly_spend" in infinite.text
    set_ = admin.set_quota(alice_row["id"], max_devices=2, max_monthly_spend=None)
    assert (set_["max_devices"], set_["max_monthly_spend"]) == (2, None)

    # over the device quota: 201, queued, with its position and the numbers
    spec = small_spec("too-wide", steps=10, regions=["eu-west", "eu-north"])
    spec["parallelism"] = {"dp": 4}
    submitted = alice.submit(spec=spec)
    assert submitted["status"] == "queued" and submitted["queue"]["position"] >= 1
    job = _wait_reason(alice, submitted["id"], "max_devices 2")
    assert job["status"] == "queued" and "0 in use + 4 requested > max_devices 2" in job["queue"]["reason"]

    bobs = bob.submit(spec=small_spec("bobs", steps=10))
    _wait_status(bob, bobs["id"], "queued")  # placed: nothing holds it back, before his cap below
    assert [e["job_id"] for e in alice.queue()] == [submitted["id"]]  # her own only
    assert submitted["id"] in {e["job_id"] for e in admin.queue()}
    assert bobs["id"] not in {e["job_id"] for e in alice.queue()}

    # the monthly cap: a quoted option over it is refused and stores nothing
    admin.set_quota(bob_row["id"], max_devices=None, max_monthly_spend=1e-9)
    quote = bob.quote(small_spec("capped", steps=10))
    before = count_rows(server)
    refused = _status(lambda: bob.submit(quote_id=quote["id"], option_id=quote["options"][0]["id"]))
    assert refused.status == 402 and refused.code == "payment_required"
    assert refused.details["max_monthly_spend"] == 1e-9 and refused.details["estimate"] > 0
    assert "max_monthly_spend" in refused.message and count_rows(server) == before

    # the CLI: cpn queue (admin: every tenant), cpn tenants quota
    runner = CliRunner()
    env = {"CPN_SERVER_URL": server.http_url, "CPN_API_KEY": ADMIN_KEY, "COLUMNS": "250"}
    out = runner.invoke(app, ["queue", "--json"], env=env)
    assert out.exit_code == 0, out.output
    assert submitted["id"] in {e["job_id"] for e in json.loads(out.output)}
    out = runner.invoke(app, ["queue"], env=env)
    assert out.exit_code == 0 and "too-wide" in out.output and "1 waiting" in out.output, out.output
    out = runner.invoke(app, ["jobs", "show", submitted["id"]], env=env)
    assert out.exit_code == 0 and "queue position 1:" in out.output, out.output
    out = runner.invoke(app, ["tenants", "quota", alice_row["id"], "--max-devices", "4"], env=env)
    assert out.exit_code == 0 and "max_devices 4" in out.output, out.output


def _wait_status(client: CpnClient, job_id: str, leaves: str, timeout_s: float = 30.0) -> dict:
    """The job once its status is no longer ``leaves``."""
    deadline = time.monotonic() + timeout_s
    while (job := client.job(job_id))["status"] == leaves:
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} still {leaves}: {job.get('queue')}")
        time.sleep(0.1)
    return job


def _wait_reason(client: CpnClient, job_id: str, text: str, timeout_s: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        job = client.job(job_id)
        if job["queue"] and text in (job["queue"]["reason"] or ""):
            return job
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id}: {job['status']} {job.get('queue')}")
        time.sleep(0.1)
