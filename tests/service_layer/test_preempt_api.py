"""`POST /v1/jobs/{id}/preempt` and `cpn jobs preempt` against a live control plane: admin only,
clear errors, an audited request, and the job back in the queue once its tasks report stopping."""

from __future__ import annotations

import time

import pytest
from typer.testing import CliRunner

from control_layer.reactions import on_task_metrics, on_task_status
from cpn.cli import app
from service_layer.client import CpnClient
from service_layer.server import ServerHandle
from tests.service_layer.harness import ADMIN_KEY, new_tenant, seed_fleet, small_spec, wait_placed

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def test_admins_preempt_a_job_which_requeues_once_its_tasks_stopped(
    server: ServerHandle, admin: CpnClient
) -> None:
    seed_fleet(server, admin)
    _, alice = new_tenant(admin, server, "alice")
    with alice:
        job = alice.submit(spec=small_spec("preemptible", preemptible=True), choice="cheapest")
        placed = wait_placed(alice, job["id"])
        assert placed["status"] == "placed" and placed["tasks"]
        r = alice._http.post(f"/v1/jobs/{job['id']}/preempt", json={"reason": "mine"})
        assert r.status_code == 403, r.text  # a tenant cannot preempt, not even its own job
    r = admin._http.post("/v1/jobs/nope/preempt", json={"reason": "room"})
    assert r.status_code == 404 and r.json()["details"]["field"] == "job_id"
    for body, field in (({"reason": "room", "grace_s": 1e9}, "grace_s"), ({"reason": ""}, "reason")):
        r = admin._http.post(f"/v1/jobs/{job['id']}/preempt", json=body)
        assert r.status_code == 422 and r.json()["details"]["errors"][0]["field"] == field, r.text
    assert admin.job(job["id"])["preemption"] is None

    result = CliRunner().invoke(
        app,
        ["jobs", "preempt", job["id"], "--reason", "room for urgent", "--by", "other", "--grace", "5"],
        env={"CPN_SERVER_URL": server.http_url, "CPN_API_KEY": ADMIN_KEY, "COLUMNS": "200"},
    )
    assert result.exit_code == 0 and "preempting (room for urgent)" in result.output, result.output
    under_way = admin.job(job["id"])
    assert under_way["status"] == "placed" and under_way["preemption"]["by_job_id"] == "other"
    assert under_way["preemption"]["grace_s"] == 5
    audit = admin._http.get("/v1/audit", params={"action": "job.preempt"}).json()
    assert [a["target"] for a in audit] == [f"job {job['id']}"]

    # The workers stop with a checkpoint of step 7 (what each agent reports), and the job is queued
    # and placed again at once (the fleet is free), resuming there.
    for t in placed["tasks"]:
        on_task_metrics(server.ctx, t["node_id"], t["id"], {"step": 7, "loss": 2.0, "checkpoint_step": 7})
        result_json = {"steps": 7, "checkpoint_step": 7, "preempted": True}
        on_task_status(server.ctx, t["node_id"], t["id"], "cancelled", "preempted", 0, result_json)
    deadline = time.monotonic() + 30
    while (again := admin.job(job["id"]))["attempt"] < 2:
        assert time.monotonic() < deadline, again
        time.sleep(0.05)
    assert again["preemptions"] == 1 and again["preemption"] is None
    assert "preempted by job other: room for urgent" in again["reason"]
    assert {c["step"] for c in again["checkpoints"].values()} == {7}
