"""The admin dashboard in headless Chromium: what a person sees, and that it updates live."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agent.output import MetricsTracker
from contracts.errors import InvalidArgument
from control_layer.reactions import on_task_metrics, on_task_status
from orchestration.settings import Settings
from proto.cpn.agent.v1 import agent_pb2
from resource_layer.convert import metrics_to_dict
from service_layer.client import CpnClient
from service_layer.dashboard.spread_svg import spread_curve_svg
from service_layer.dashboard.svg import loss_curve_svg
from service_layer.server import ServerHandle, start_server_in_thread
from tests.service_layer.browser import CHROMIUM, Browser, dump_dom
from tests.service_layer.harness import ADMIN_KEY, measure_link, seed_fleet, small_spec, wait_placed

pytestmark = pytest.mark.browser

needs_chromium = pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason="chromium is not installed")


def test_svg_paths_breaks_and_floor() -> None:
    svg = loss_curve_svg(
        {"eu-west": [(1, 4.0), (2, 3.0), (3, None), (4, 2.0), (5, 1.5)], "us-east": [(1, 4.2)]},
        floor=1.2,
        uniform=4.16,
        total_steps=10,
    )
    west = re.search(r'data-region="eu-west" data-points="(\d+)"[^>]* d="([^"]+)"', svg)
    assert west and west.group(1) == "4"
    assert west.group(2).count("M") == 2 and west.group(2).count("L") == 2  # the None breaks the line
    assert 'class="floor" data-value="1.200000"' in svg and "entropy floor 1.200" in svg
    assert "no metrics yet" in loss_curve_svg({}, floor=1.0, uniform=4.0, total_steps=10)


def _metrics(server: ServerHandle, job: dict, steps: range) -> None:
    for step in steps:
        for t in job["tasks"]:
            on_task_metrics(
                server.ctx,
                t["node_id"],
                t["id"],
                {
                    "step": step,
                    "total_steps": 60,
                    "loss": 1.0 + 3.2 * 0.95**step,
                    "tokens_per_s": 2000.0,
                    "entropy_floor": 1.05,  # the worker reports its data's floor with every step
                },
            )


@pytest.fixture
def prod_server(tmp_path: Path) -> Iterator[ServerHandle]:
    settings = Settings(
        environment="production",
        secret_key="s3cret-for-the-dashboard-test",
        data_dir=tmp_path / "data",
        http_port=0,
        grpc_port=0,
        admin_api_key=ADMIN_KEY,
        heartbeat_interval_s=10.0,
        heartbeat_misses=6,
    )
    handle = start_server_in_thread(settings)
    yield handle
    handle.stop()


def test_dashboard_needs_the_admin_key_outside_development(prod_server: ServerHandle) -> None:
    url = prod_server.http_url + "/dashboard"
    page = httpx.get(url, timeout=10)
    assert page.status_code == 401 and "Admin sign-in" in page.text
    assert httpx.get(url + "/fragments/overview", timeout=10).status_code == 401
    login = url + "/login"
    wrong = httpx.post(login, data={"key": "cpn_wrong-key-0123456789", "next": "/dashboard"}, timeout=10)
    assert wrong.status_code == 401 and "set-cookie" not in wrong.headers
    # a key in the URL is not a sign-in: it would sit in browser history and access logs
    in_url = httpx.get(url, params={"key": ADMIN_KEY}, timeout=10)
    assert in_url.status_code == 401 and "set-cookie" not in in_url.headers
    with httpx.Client(base_url=prod_server.http_url, timeout=10) as browser:
        r = browser.post("/dashboard/login", data={"key": ADMIN_KEY, "next": "/dashboard/jobs/x?y=1"})
        assert r.status_code == 303 and r.headers["location"] == "/dashboard/jobs/x?y=1"
        assert "httponly" in r.headers["set-cookie"].lower() and ADMIN_KEY not in r.headers["set-cookie"]
        assert browser.get("/dashboard").status_code == 200
        off_site = browser.post("/dashboard/login", data={"key": ADMIN_KEY, "next": "https://evil.example/"})
        assert off_site.headers["location"] == "/dashboard"
    # a tenant's (non-admin) key does not open it
    with CpnClient(prod_server.http_url, ADMIN_KEY) as admin:
        tenant = admin.create_tenant("viewer")
        key = admin.create_key(tenant["id"])["key"]
    assert httpx.post(login, data={"key": key}, timeout=10).status_code == 403


@needs_chromium
def test_dashboard_in_chromium_shows_fleet_jobs_and_a_live_loss_curve(
    prod_server: ServerHandle, tmp_path: Path
) -> None:
    server = prod_server
    with CpnClient(server.http_url, ADMIN_KEY) as admin:
        seed_fleet(server, admin)
        job = wait_placed(
            admin, admin.submit(spec=small_spec("curve-job", steps=60), choice="cheapest")["id"]
        )
    for t in job["tasks"]:
        on_task_status(server.ctx, t["node_id"], t["id"], "running")
    _metrics(server, job, range(1, 21))
    measure_link(server, "eu-north", "eu-west")

    dom = dump_dom(server.http_url + "/dashboard", tmp_path / "profile-dump")
    assert "Admin sign-in" in dom and "paris-1" not in dom  # no cookie, no data

    browser = Browser(tmp_path / "profile")
    try:
        browser.open(f"{server.http_url}/dashboard", "/dashboard")
        sign_in = f"document.getElementById('key').value = {ADMIN_KEY!r};"
        browser.evaluate(sign_in + " document.querySelector('form.login').submit()")
        browser.wait_for("document.body.innerText.includes('paris-1')", timeout_s=15)
        assert ADMIN_KEY not in browser.evaluate("location.href")
        text = browser.evaluate("document.body.innerText")
        for name in ("eu-west", "eu-north", "paris-1", "stockholm-1", "curve-job"):
            assert name in text, name
        assert (
            browser.evaluate(
                f"document.querySelector('tr[data-job-id=\"{job['id']}\"] .job-status').innerText.trim()"
            )
            == "running"
        )
        assert browser.evaluate("document.querySelectorAll('.node-row .pill-alive').length") == 2
        source = "document.querySelector('tr[data-link=\"{}\"] .link-source').innerText.trim()"
        assert browser.evaluate(source.format("eu-north|eu-west")) == "measured"
        assert browser.evaluate(source.format("eu-west|eu-north")) == "declared"
        assert "80.0 Mbit/s" in browser.evaluate("document.getElementById('links').innerText")
        browser.screenshot(tmp_path / "overview.png")

        browser.open(f"{server.http_url}/dashboard/jobs/{job['id']}", f"/dashboard/jobs/{job['id']}")
        assert browser.evaluate("document.getElementById('job-status').innerText.trim()") == "running"
        points = "Number(document.querySelector('svg.loss-curve path.series').dataset.points)"
        assert browser.evaluate(points) == 20
        d = browser.evaluate("document.querySelector('svg.loss-curve path.series').getAttribute('d')")
        assert d.startswith("M") and d.count("L") == 19
        floor = browser.evaluate("document.querySelector('svg.loss-curve line.floor').dataset.value")
        detail = CpnClient(server.http_url, ADMIN_KEY).job(job["id"])
        assert float(floor) == pytest.approx(detail["entropy_floor"], abs=1e-5) == pytest.approx(1.05)
        assert "entropy floor" in browser.evaluate("document.querySelector('svg.loss-curve').textContent")

        # the page follows the job without a reload
        browser.evaluate("window.__sameDocument = true")
        _metrics(server, job, range(21, 41))
        browser.wait_for(f"{points} === 40", timeout_s=15)
        for t in job["tasks"]:
            on_task_status(
                server.ctx,
                t["node_id"],
                t["id"],
                "succeeded",
                exit_code=0,
                result={"loss_start": 4.2, "loss_end": 1.4},
            )
        browser.wait_for(
            "document.getElementById('job-status').innerText.trim() === 'succeeded'", timeout_s=15
        )
        assert browser.evaluate("window.__sameDocument") is True
        assert browser.evaluate("document.querySelector('[data-final]').dataset.final") == "true"
        shot = browser.screenshot(tmp_path / "job.png")
        assert shot.stat().st_size > 10_000
    finally:
        browser.close()


@needs_chromium
def test_job_page_shows_where_the_time_went_and_the_overview_the_accuracy_of_all_quotes(
    prod_server: ServerHandle, tmp_path: Path
) -> None:
    server = prod_server
    with CpnClient(server.http_url, ADMIN_KEY) as admin:
        seed_fleet(server, admin)
        job = wait_placed(
            admin, admin.submit(spec=small_spec("timed-job", steps=20), choice="cheapest")["id"]
        )
    for t in job["tasks"]:
        on_task_status(server.ctx, t["node_id"], t["id"], "running")
    parts = {"data_s": 0.01, "compute_s": 0.2, "optimizer_s": 0.03, "sync_s": 0.05, "checkpoint_s": 0.0}
    for step in range(1, 21):
        for t in job["tasks"]:
            on_task_metrics(
                server.ctx, t["node_id"], t["id"], {"step": step, "loss": 2.0, **parts, "wall_s": 0.29}
            )
    for t in job["tasks"]:
        result = {"steps": 20, "startup_s": 7.0, "train_s": 5.8, "final_sync_s": 0.1, "teardown_s": 1.5,
                  "parts_total_s": {k: 20 * v for k, v in parts.items()}}  # fmt: skip
        on_task_status(server.ctx, t["node_id"], t["id"], "succeeded", exit_code=0, result=result)
    detail = CpnClient(server.http_url, ADMIN_KEY).job(job["id"])
    assert detail["status"] == "succeeded" and detail["accuracy"]["estimated"]["steps"] == 20

    browser = Browser(tmp_path / "profile")
    try:
        browser.open(f"{server.http_url}/dashboard", "/dashboard")
        sign_in = f"document.getElementById('key').value = {ADMIN_KEY!r};"
        browser.evaluate(sign_in + " document.querySelector('form.login').submit()")
        browser.wait_for("document.body.textContent.includes('Quote accuracy')", timeout_s=15)
        rows = "document.querySelectorAll('#accuracy .accuracy-row').length"
        assert browser.evaluate(rows) == 2
        assert "over 1 job" in browser.evaluate("document.getElementById('accuracy').textContent")
        assert browser.evaluate("document.querySelectorAll('#error-history tbody tr').length") == 2
        # The run taught the calibration its nodes' start-up and teardown and the devices' efficiency.
        rows_js = "Array.from(document.querySelectorAll('#calibration .factor-row'))"
        kinds = browser.evaluate(rows_js + ".map(r => r.dataset.kind).join(',')")
        assert {"efficiency", "startup_s", "teardown_s"} <= set(kinds.split(","))
        browser.screenshot(tmp_path / "overview.png")

        browser.open(f"{server.http_url}/dashboard/jobs/{job['id']}", f"/dashboard/jobs/{job['id']}")
        text = browser.evaluate("document.getElementById('time-breakdown').textContent")
        for label in (
            "start-up",
            "training steps",
            "teardown",
            "billed span",
            "forward/backward",
            "sync wait",
        ):
            assert label in text, label
        startup = browser.evaluate(
            "document.querySelector('#time-breakdown tr[data-part=\"start-up\"]').textContent"
        )
        assert "7.0s" in startup  # what the tasks reported, next to the quote's start-up
        shot = browser.screenshot(tmp_path / "job-accuracy.png")
        assert shot.stat().st_size > 10_000
    finally:
        browser.close()


def test_spread_svg_draws_checks_and_skips_bad_values() -> None:
    svg = spread_curve_svg({"eu-west": [(10, 0.4), (20, float("nan")), (30, 0.1), (40, 0.0)]}, total_steps=40)
    west = re.search(r'data-region="eu-west" data-points="(\d+)" data-last="([^"]+)"', svg)
    assert west and west.group(1) == "3" and float(west.group(2)) == 0.0
    assert svg.count('class="check"') == 3
    assert "no spread check yet" in spread_curve_svg({}, total_steps=10)


@needs_chromium
def test_gossip_spread_travels_from_the_worker_line_to_the_job_page(
    prod_server: ServerHandle, tmp_path: Path
) -> None:
    server = prod_server
    spec = {**small_spec("gossip-job", steps=40), "sync": {"mode": "gossip", "every": 5}}
    with CpnClient(server.http_url, ADMIN_KEY) as admin:
        seed_fleet(server, admin)
        job = wait_placed(admin, admin.submit(spec=spec, choice="cheapest")["id"])
    for t in job["tasks"]:
        on_task_status(server.ctx, t["node_id"], t["id"], "running")
    # What a gossip worker prints: its spread only on check steps (every 10 here), 0 at the end.
    spread = {10: 0.08, 20: 0.05, 30: 0.03, 40: 0.0}
    trackers = {t["id"]: MetricsTracker(total_steps=40) for t in job["tasks"]}
    for step in range(1, 41):
        for t in job["tasks"]:
            line = {"step": step, "loss": 1.0 + 3.0 * 0.9**step, "wall_s": 0.1, "sync": {}}
            if step in spread:
                line["gossip_spread"] = spread[step]
            latest = trackers[t["id"]].update(line)
            # The agent's TaskMetrics message, as the server's resource layer reads it.
            back = metrics_to_dict(agent_pb2.TaskMetrics(assignment_id=t["id"], **latest))
            assert ("gossip_spread" in back) == (step in spread)
            on_task_metrics(server.ctx, t["node_id"], t["id"], back)
    task = job["tasks"][0]
    with pytest.raises(InvalidArgument, match="metrics.gossip_spread"):
        on_task_metrics(server.ctx, task["node_id"], task["id"], {"step": 41, "gossip_spread": -1.0})
    with CpnClient(server.http_url, ADMIN_KEY) as admin:
        stored = admin.metrics(job["id"])["spread"][task["region"]]
    assert [(p["step"], p["spread"]) for p in stored] == sorted(spread.items())

    browser = Browser(tmp_path / "profile")
    try:
        browser.open(f"{server.http_url}/dashboard", "/dashboard")
        sign_in = f"document.getElementById('key').value = {ADMIN_KEY!r};"
        browser.evaluate(sign_in + " document.querySelector('form.login').submit()")
        browser.wait_for("document.body.innerText.includes('gossip-job')", timeout_s=15)
        browser.open(f"{server.http_url}/dashboard/jobs/{job['id']}", f"/dashboard/jobs/{job['id']}")
        path = "document.querySelector('#gossip-spread svg.spread-curve path.series')"
        assert browser.evaluate(f"Number({path}.dataset.points)") == 4
        assert float(browser.evaluate(f"{path}.dataset.last")) == 0.0
        d = browser.evaluate(f"{path}.getAttribute('d')")
        ys = [float(p.split(",")[1]) for p in re.findall(r"[ML]([\d.]+,[\d.]+)", d)]
        assert ys == sorted(ys)  # falling spread: each check lower on the page than the one before
        shot = browser.screenshot(tmp_path / "gossip-spread.png")
        assert shot.stat().st_size > 10_000
    finally:
        browser.close()
