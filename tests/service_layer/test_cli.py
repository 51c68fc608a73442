"""The `cpn` client commands against a live control plane (typer's runner, real HTTP)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from control_layer.reactions import on_task_metrics, on_task_status
from cpn.cli import app
from service_layer.client import CpnClient
from service_layer.server import ServerHandle
from tests.service_layer.harness import ADMIN_KEY, seed_fleet, small_spec, wait_placed

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def _cpn(server: ServerHandle, key: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        app, list(args), env={"CPN_SERVER_URL": server.http_url, "CPN_API_KEY": key, "COLUMNS": "200"}
    )
    return result.exit_code, result.output


def _finish(server: ServerHandle, job: dict, delay_s: float) -> None:
    time.sleep(delay_s)
    for t in job["tasks"]:
        on_task_status(server.ctx, t["node_id"], t["id"], "running")
    for step in (1, 5, 10):
        for t in job["tasks"]:
            on_task_metrics(
                server.ctx, t["node_id"], t["id"], {"step": step, "loss": 3.0 / step, "tokens_per_s": 500.0}
            )
        time.sleep(0.3)
    for t in job["tasks"]:
        on_task_status(server.ctx, t["node_id"], t["id"], "succeeded", exit_code=0, result={"loss_end": 0.3})


def test_cli_from_tenant_to_finished_job(server: ServerHandle, admin: CpnClient, tmp_path: Path) -> None:
    code, out = _cpn(server, ADMIN_KEY, "tenants", "create", "carol", "--json")
    assert code == 0, out
    carol = json.loads(out)["key"]["key"]
    code, out = _cpn(
        server, ADMIN_KEY, "tokens", "create", "--provider", "acme", "--max-uses", "3", "--quiet"
    )
    assert code == 0 and out.strip().startswith("cpn_enroll_"), out
    seed_fleet(server, admin)

    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(small_spec("cli-job", steps=10)))
    code, out = _cpn(server, carol, "quote", "-f", str(job_file), "--json")
    assert code == 0, out
    quote = json.loads(out)
    assert quote["options"]
    code, out = _cpn(server, carol, "quote", "-f", str(job_file))
    assert code == 0 and "est. cost" in out and quote["options"][0]["id"] in out, out

    code, out = _cpn(
        server,
        carol,
        "jobs",
        "submit",
        "--quote",
        quote["id"],
        "--option",
        quote["options"][0]["id"],
        "--json",
    )
    assert code == 0, out
    job = wait_placed(CpnClient(server.http_url, carol), json.loads(out)["id"])
    code, out = _cpn(server, carol, "jobs", "list")
    assert code == 0 and "cli-job" in out and "placed" in out, out

    finisher = threading.Thread(target=_finish, args=(server, job, 1.0), daemon=True)
    finisher.start()
    code, out = _cpn(server, carol, "jobs", "watch", job["id"], "--interval", "0.2")
    finisher.join()
    assert code == 0, out
    assert "job.running" in out and "job.succeeded" in out and "placement" in out, out
    code, out = _cpn(server, carol, "jobs", "show", job["id"], "--json")
    assert json.loads(out)["status"] == "succeeded"

    code, out = _cpn(server, carol, "jobs", "submit", "-f", str(job_file), "--choice", "fastest", "--json")
    assert code == 0, out
    other = json.loads(out)["id"]
    code, out = _cpn(server, carol, "jobs", "cancel", other, "--reason", "enough")
    assert code == 0 and "cancelled" in out, out
    code, out = _cpn(server, carol, "jobs", "cancel", other)
    assert code == 1 and "409" in out, out

    code, out = _cpn(server, carol, "tokens", "create", "--provider", "acme")
    assert code == 1 and "403" in out, out
    code, out = _cpn(server, "cpn_wrong-wrong-wrong-wrong", "jobs", "list")
    assert code == 1 and "401" in out, out


def test_bad_spec_is_refused_locally_naming_the_field(server: ServerHandle, tmp_path: Path) -> None:
    spec = small_spec()
    spec["training"]["steps"] = -1
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(spec))
    code, out = _cpn(server, ADMIN_KEY, "quote", "-f", str(bad))
    assert code == 2 and "training.steps" in out, out
    code, out = _cpn(server, ADMIN_KEY, "jobs", "submit", "-f", str(bad))
    assert code == 2 and "training.steps" in out, out
    assert CpnClient(server.http_url, ADMIN_KEY).jobs() == []


def test_snapshot_export_then_offline_plan(server: ServerHandle, admin: CpnClient, tmp_path: Path) -> None:
    seed_fleet(server, admin)
    snap = tmp_path / "snap.json"
    code, out = _cpn(server, ADMIN_KEY, "snapshot", "export", "-o", str(snap))
    assert code == 0, out
    assert {c["name"] for c in json.loads(snap.read_text())["clusters"]} == {"paris-1", "stockholm-1"}
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(small_spec()))
    runner = CliRunner(env={"COLUMNS": "200"})
    result = runner.invoke(app, ["plan", "--snapshot", str(snap), "--job", str(job_file), "--json"])
    assert result.exit_code == 0, result.output
    options = json.loads(result.output)
    assert options and all(o["estimates"]["cost"]["total"] > 0 for o in options)
    table = runner.invoke(app, ["plan", "--snapshot", str(snap), "--job", str(job_file)])
    assert table.exit_code == 0, table.output
    assert options[0]["id"] in table.output
    nowhere = tmp_path / "nowhere.yaml"
    nowhere.write_text(yaml.safe_dump(small_spec(regions=["mars-1"])))
    result = runner.invoke(app, ["plan", "--snapshot", str(snap), "--job", str(nowhere)])
    assert result.exit_code == 1 and "no feasible plan" in result.output, result.output
