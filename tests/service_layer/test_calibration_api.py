"""A job that ends calibrates the planner: its record in GET /v1/jobs/{id}, the table and history in
GET /v1/calibration (admin only), and the next quote planned with it, its interval narrowed."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import select

from control_layer.reactions import on_task_metrics, on_task_status
from orchestration.db.models import Event
from service_layer.client import ApiError, CpnClient
from service_layer.server import ServerHandle
from tests.service_layer.harness import new_tenant, seed_fleet, small_spec, wait_placed


def _run_to_success(server: ServerHandle, client: CpnClient, spec: dict, slowdown: float) -> dict:
    """Submit, then report what a worker would: per-step parts ``slowdown`` × the estimate, and a result."""
    quote = client.quote(spec)
    job = wait_placed(client, client.submit(quote_id=quote["id"], option_id=quote["options"][0]["id"])["id"])
    compute = job["option"]["estimates"]["step_s"]["compute"] * slowdown
    for t in job["tasks"]:
        on_task_status(server.ctx, t["node_id"], t["id"], "running")
    for t in job["tasks"]:
        for step in range(1, 6):
            on_task_metrics(
                server.ctx,
                t["node_id"],
                t["id"],
                {
                    "step": step,
                    "loss": 2.0,
                    "data_s": 0.001,
                    "compute_s": compute,
                    "sync_s": 0.0,
                    "wall_s": compute,
                },
            )
    time.sleep(0.05)  # a measurable billed span
    for t in job["tasks"]:
        result = {"steps": 5, "startup_s": 3.5, "train_s": 5 * compute, "teardown_s": 0.2}
        on_task_status(server.ctx, t["node_id"], t["id"], "succeeded", "", 0, result)
    return client.job(job["id"])


def test_a_finished_job_calibrates_the_next_quote(server: ServerHandle, admin: CpnClient) -> None:
    seed_fleet(server, admin)
    _, tenant = new_tenant(admin, server, "acme")
    with tenant:
        spec = small_spec(steps=5)
        first = tenant.quote(spec)["options"][0]["estimates"]
        assert first["interval"]["residuals"] == 0  # no history: the wide default band
        assert first["basis"]["efficiency"] == {"cpu|fp32": 0.5}

        done = _run_to_success(server, tenant, spec, slowdown=4.0)
        assert done["status"] == "succeeded"
        acc = done["accuracy"]
        assert acc["estimated"]["duration_s"] == done["option"]["estimates"]["duration_s"]
        assert acc["actual"]["duration_s"] > 0 and acc["actual"]["cost"] == pytest.approx(done["actual_cost"])
        assert acc["error"]["time"] == pytest.approx(
            acc["actual"]["duration_s"] / acc["estimated"]["duration_s"] - 1
        )
        assert acc["actual"]["tasks"][0]["step_s"]["compute_s"] == pytest.approx(
            4.0 * done["option"]["estimates"]["step_s"]["compute"]
        )
        assert acc["actual"]["tasks"][0]["startup_s"] == 3.5

        with pytest.raises(ApiError) as forbidden:
            tenant.calibration()
        assert forbidden.value.status == 403

        table = admin.calibration()
        node = done["tasks"][0]["node_id"]
        assert table["calibration"]["device_efficiency"] == {"cpu|fp32": pytest.approx(0.125)}
        assert table["calibration"]["startup_s"][node] == 3.5
        kinds = {(c["kind"], c["key"]) for c in table["history"]}
        assert {("efficiency", "cpu|fp32"), ("startup_s", node), ("time", "job"), ("cost", "job")} <= kinds
        assert all(c["job_id"] == done["id"] for c in table["history"])
        assert {f["kind"] for f in table["factors"]} == {"efficiency", "startup_s", "teardown_s"}
        assert table["calibration"]["teardown_s"][node] == pytest.approx(0.2)

        # The next quote is planned with it: the same cheapest placement, four times the compute.
        option = tenant.quote(spec)["options"][0]
        assert option["estimates"]["basis"]["efficiency"] == {"cpu|fp32": pytest.approx(0.125)}
        assert option["tasks"] == done["option"]["tasks"]
        assert option["estimates"]["step_s"]["compute"] == pytest.approx(4.0 * first["step_s"]["compute"])
        # ... and the node's start-up and teardown as the run measured them.
        assert (option["estimates"]["startup_s"], option["estimates"]["teardown_s"]) == pytest.approx(
            (3.5, 0.2)
        )


def test_a_queued_tasks_start_teaches_its_nodes_queue_wait_at_once(
    server: ServerHandle, admin: CpnClient
) -> None:
    """A scheduler-backed task reports RUNNING with the wait it measured (50 s) against the one its
    agent expected (20 s): the node's queue wait is learned then, while the job still runs, once
    (a resent report teaches nothing), and the job's end does not teach it again."""
    seed_fleet(server, admin)
    _, tenant = new_tenant(admin, server, "acme")
    with tenant:
        spec = small_spec(steps=5)
        quote = tenant.quote(spec)
        job = wait_placed(
            tenant, tenant.submit(quote_id=quote["id"], option_id=quote["options"][0]["id"])["id"]
        )
        task = job["tasks"][0]
        waits = {"queue_wait_s": 50.0, "queue_wait_estimate_s": 20.0}
        on_task_status(server.ctx, task["node_id"], task["id"], "running", "slurm job 7", 0, waits)
        on_task_status(server.ctx, task["node_id"], task["id"], "running", "slurm job 7", 0, waits)
        table = admin.calibration()
        assert table["calibration"]["queue_wait_s"] == {task["node_id"]: pytest.approx(30.0)}
        rows = [c for c in table["history"] if c["kind"] == "queue_wait_s"]
        assert [(c["job_id"], c["observed"]) for c in rows] == [(job["id"], pytest.approx(30.0))]
        for t in job["tasks"]:
            result = {"steps": 5, "startup_s": 3.5, "train_s": 1.0} | waits
            on_task_status(server.ctx, t["node_id"], t["id"], "succeeded", "", 0, result)
        assert tenant.job(job["id"])["status"] == "succeeded"
        after = admin.calibration()
        assert after["calibration"]["queue_wait_s"] == {task["node_id"]: pytest.approx(30.0)}
        assert len([c for c in after["history"] if c["kind"] == "queue_wait_s"]) == 1


def test_a_task_starts_even_when_learning_from_its_start_fails(
    server: ServerHandle, admin: CpnClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What learning wrote is rolled back; the task's RUNNING commits, the failure kept as an event."""

    def fails(session: object, task: object) -> bool:
        raise ValueError("a value the database refuses")

    monkeypatch.setattr("control_layer.reactions.on_task_start", fails)
    seed_fleet(server, admin)
    _, tenant = new_tenant(admin, server, "acme")
    with tenant:
        quote = tenant.quote(small_spec(steps=5))
        job = wait_placed(
            tenant, tenant.submit(quote_id=quote["id"], option_id=quote["options"][0]["id"])["id"]
        )
        task = job["tasks"][0]
        waits = {"queue_wait_s": 50.0, "queue_wait_estimate_s": 20.0}
        on_task_status(server.ctx, task["node_id"], task["id"], "running", "slurm job 7", 0, waits)
        assert tenant.job(job["id"])["tasks"][0]["status"] == "running"
        with server.ctx.session_factory() as session:
            kinds = set(session.scalars(select(Event.kind).where(Event.job_id == job["id"])))
        assert "task.calibration_failed" in kinds and "task.running" in kinds
        assert admin.calibration()["calibration"]["queue_wait_s"] == {}
