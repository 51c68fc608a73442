"""The dashboard's region map, a job's placement on it, the queue, costs, and tenants with their keys:
the pure parts on data, then every page in headless Chromium against a live control plane."""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from contracts.states import JobState
from control_layer.jobs import place_job
from control_layer.reactions import on_task_metrics, on_task_status
from orchestration.db.engine import make_engine, make_session_factory
from orchestration.db.models import ApiKey, LeaderLease
from orchestration.leadership import SINGLETONS
from service_layer.auth import revoke_api_key
from service_layer.client import CpnClient
from service_layer.dashboard.link_use import Sample, Sender, link_use, task_rates
from service_layer.dashboard.map_svg import region_map_svg
from service_layer.dashboard.region_map import JobOverlay, LinkLine, RegionBox, region_boxes
from service_layer.dashboard.sync_edges import SyncEdges, job_sync_edges
from service_layer.server import ServerHandle, start_server_in_thread
from tests.conftest import postgres_unreachable, redis_unreachable, settings_for
from tests.dbtemplate import create_postgres_database, drop_postgres_database_later
from tests.service_layer.browser import CHROMIUM, Browser
from tests.service_layer.harness import (
    ADMIN_KEY,
    measure_link,
    new_tenant,
    register_node,
    seed_fleet,
    small_spec,
)

SHOTS = Path("/tmp/cpn-dashboard-shots")


def _option(mode: str, ring: list[str], regions: dict[str, str], gossip: dict[str, list[str]] | None = None):
    return {
        "sync": {"mode": mode, "ring": ring, "gossip": gossip or {}},
        "tasks": [{"cluster": c, "region": r} for c, r in regions.items()],
    }


def test_sync_edges_follow_the_workers_rules() -> None:
    three = {"c-a": "eu-west", "c-b": "eu-north", "c-c": "us-east"}
    ring = job_sync_edges(_option("diloco", ["c-b", "c-a", "c-c"], three))
    assert ring.shape == "ring"
    assert ring.edges == (("eu-north", "eu-west"), ("eu-west", "us-east"), ("us-east", "eu-north"))
    pair = job_sync_edges(_option("sync", ["c-a", "c-b"], {"c-a": "eu-west", "c-b": "eu-north"}))
    assert pair.shape == "pair" and set(pair.edges) == {("eu-west", "eu-north"), ("eu-north", "eu-west")}
    gossip = job_sync_edges(_option("gossip", [], three, {"c-a": ["c-b"], "c-b": ["c-a", "c-c"]}))
    assert gossip.edges == (("eu-west", "eu-north"), ("eu-north", "eu-west"), ("eu-north", "us-east"))
    star = job_sync_edges(_option("async", ["c-a", "c-b", "c-c"], three))
    assert star.shape == "star" and all("eu-north" in e for e in star.edges) and len(star.edges) == 4
    # two clusters of one region: nothing crosses a link between regions
    one = job_sync_edges(_option("diloco", ["c-a", "c-b"], {"c-a": "eu-west", "c-b": "eu-west"}))
    assert one.edges == () and job_sync_edges(None).edges == ()


def test_link_use_is_the_window_rate_split_over_the_jobs_links() -> None:
    samples = [
        Sample("t1", 0.0, 1_000),
        Sample("t1", 10.0, 11_000),  # 1000 B/s
        Sample("t2", 0.0, 50_000),
        Sample("t2", 5.0, 0),  # the worker restarted: its counter began again
        Sample("t2", 10.0, 4_000),
        Sample("t3", 3.0, 9_999),  # one sample: no rate
    ]
    rates = task_rates(samples)
    assert rates == {"t1": pytest.approx(1000.0), "t2": pytest.approx(400.0)}
    edges = {"j1": [("a", "b"), ("b", "c"), ("c", "a")], "j2": [("b", "a"), ("b", "c")]}
    use = link_use([Sender("t1", "j1", "a"), Sender("t2", "j2", "b"), Sender("t3", "j1", "c")], rates, edges)
    assert use == {
        ("a", "b"): pytest.approx(1000.0),
        ("b", "a"): pytest.approx(200.0),
        ("b", "c"): pytest.approx(200.0),
    }


REGIONS = (
    RegionBox("eu-north", "EU", ("stockholm-1",), 1, 1, 1, 1, 0, 2.5e9),
    RegionBox("eu-west", "EU", ("paris-1",), 1, 1, 2, 0, 0, 0.0),
    RegionBox("us-east", "US", ("virginia-1",), 0, 1, 0, 0, 2, 0.0),
)
LINKS = (
    LinkLine("eu-north", "eu-west", 0.08, 10.0, "measured", use_bps=2.5e6),
    LinkLine("eu-west", "eu-north", 1.0, 25.0, "declared"),
    LinkLine("eu-west", "us-east", 0.5, 40.0, "declared"),
)


def _links_in(svg: str) -> dict[tuple[str, str], str]:
    return {
        (m.group(2), m.group(3)): m.group(0)
        for m in re.finditer(
            r'<g class="link (\w+)" data-src="([^"]+)" data-dst="([^"]+)"[^>]*>.*?</g>', svg, re.S
        )
    }


def test_region_map_svg_marks_measured_declared_and_use() -> None:
    svg = region_map_svg(REGIONS, LINKS)
    assert svg == region_map_svg(REGIONS, LINKS)  # deterministic
    links = _links_in(svg)
    assert set(links) == {("eu-north", "eu-west"), ("eu-west", "eu-north"), ("eu-west", "us-east")}
    measured, declared = links[("eu-north", "eu-west")], links[("eu-west", "eu-north")]
    assert "stroke-dasharray" not in measured and "stroke-dasharray" in declared
    width = re.compile(r'stroke-width="([\d.]+)"')
    assert float(width.search(measured).group(1)) > float(width.search(declared).group(1)) + 4
    assert "80 Mb/s · 10 ms" in svg and "2.5 MB/s in use" in svg and "1 Gb/s · 25 ms" in svg
    assert "measured link" in svg and "declared link" in svg  # the legend
    assert 'data-region="us-east" data-free="0" data-used="0" data-down="2"' in svg
    assert "sync-edge" not in svg and "dimmed" not in svg


def test_a_measuring_nodes_devices_are_not_counted_free() -> None:
    """Alive but not offered yet (its profile still measuring): its idle devices are down, not free."""
    from service_layer.schemas.resources import ClusterRead, DeviceRead, NodeRead

    def node(status: str, allocated: tuple[bool, ...]) -> NodeRead:
        devices = [
            DeviceRead(index=i, model="cpu", kind="cpu", memory_gb=1.0, measured_tflops=0.1, allocated=a)
            for i, a in enumerate(allocated)
        ]
        return NodeRead(
            id=status, hostname=status, status=status, alive=True, last_heartbeat_at=None,
            heartbeat_age_s=None, advertise_host="127.0.0.1", agent_version="test", devices=devices,
        )  # fmt: skip

    nodes = [node("alive", (True, False)), node("measuring", (False, False))]
    cluster = ClusterRead(
        id="c", name="paris-1", region="eu-west", provider="lumen", intra_bandwidth_gbps=10.0,
        price_per_device_hour=1.0, spot_price_per_device_hour=None, nodes=nodes,
    )  # fmt: skip
    (box,) = region_boxes([], [cluster], {})
    assert (box.nodes_alive, box.devices_used, box.devices_free, box.devices_down) == (2, 1, 1, 2)


def test_region_map_svg_draws_a_job_and_escapes_names() -> None:
    hostile = RegionBox('<script>alert("x")</script>', "", ("<b>c</b>",), 1, 1, 1, 0, 0, 0.0)
    job = JobOverlay(
        name="<img src=x onerror=alert(1)>",
        devices={"eu-north": 1, "eu-west": 2},
        clusters={"eu-north": ("stockholm-1",), "eu-west": ("paris-1",)},
        sync=SyncEdges("diloco", "pair", (("eu-north", "eu-west"), ("eu-west", "eu-north"))),
    )
    svg = region_map_svg((*REGIONS, hostile), LINKS, job)
    assert "<script>" not in svg and "<img" not in svg and "&lt;script&gt;" in svg
    assert re.findall(r'class="sync-edge" data-src="([^"]+)" data-dst="([^"]+)"', svg) == [
        ("eu-north", "eu-west"),
        ("eu-west", "eu-north"),
    ]
    assert (
        'class="region in-job" data-region="eu-west"' in svg
        and 'class="region dimmed" data-region="us-east"' in svg
    )
    assert "this job: 2 devices · paris-1" in svg and 'data-job-devices="2"' in svg
    # many regions: compact cards, figures in tooltips only
    many = tuple(RegionBox(f"r{i:02d}") for i in range(12))
    full_mesh = tuple(LinkLine(a.name, b.name, 1.0, 5.0, "declared") for a in many for b in many if a != b)
    big = region_map_svg(many, full_mesh)
    assert big.count('<g class="link declared"') == 132 and 'class="link-label"' not in big
    assert big == region_map_svg(tuple(reversed(many)), tuple(reversed(full_mesh)))  # order-free
    assert "no regions yet" in region_map_svg((), ())


# ---------------------------------------------------------------- in Chromium

needs_chromium = pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason="chromium is not installed")


@pytest.fixture
def standby_server(tmp_path: Path) -> Iterator[ServerHandle]:
    """A control plane on PostgreSQL and Redis whose placer never runs here: another replica holds
    the singletons' lease (and keeps it for the whole test), so submitted jobs wait in the queue
    until the test places them as that leader would."""
    for reason in (postgres_unreachable(), redis_unreachable()):
        if reason is not None:
            pytest.skip(reason)
    url = create_postgres_database(migrated=True)
    engine = make_engine(url)
    with make_session_factory(engine)() as s, s.begin():
        s.add(LeaderLease(name=SINGLETONS, epoch=1, beat=1, holder="replica-b"))
    engine.dispose()
    settings = settings_for(
        url,
        environment="production",
        secret_key="s3cret-for-the-dashboard-pages-test",
        data_dir=tmp_path / "data",
        http_port=0,
        grpc_port=0,
        admin_api_key=ADMIN_KEY,
        heartbeat_interval_s=10.0,
        heartbeat_misses=6,
        leader_lease_s=300,
    )
    handle = start_server_in_thread(settings)
    try:
        yield handle
    finally:
        handle.stop()
        drop_postgres_database_later(url)


def _sign_in(browser: Browser, base: str) -> None:
    browser.open(f"{base}/dashboard", "/dashboard")
    sign_in = f"document.getElementById('key').value = {ADMIN_KEY!r};"
    browser.evaluate(sign_in + " document.querySelector('form.login').submit()")
    browser.wait_for(
        "document.querySelector('nav a[data-nav=\"map\"]') && !document.getElementById('key')", 15
    )
    browser.errors.clear()  # the sign-in page itself answers 401


def _visit(browser: Browser, base: str, path: str, shot: str) -> str:
    """Open a page by its navigation link, check it drew without an error, and keep a screenshot."""
    slug = path.rsplit("/", 1)[-1]
    if browser.evaluate(f"!!document.querySelector('nav a[data-nav=\"{slug}\"]')"):
        browser.evaluate(f"document.querySelector('nav a[data-nav=\"{slug}\"]').click()")
        browser.wait_for(f"location.pathname === {path!r} && document.readyState === 'complete'", 15)
    else:
        browser.open(base + path, path)
    assert browser.console_errors() == [], path
    SHOTS.mkdir(parents=True, exist_ok=True)
    browser.screenshot(SHOTS / shot)
    return browser.evaluate("document.querySelector('main').innerText")


def _wan_metrics(server: ServerHandle, job: dict, step: int, per_step: int) -> None:
    for t in job["tasks"]:
        on_task_metrics(
            server.ctx,
            t["node_id"],
            t["id"],
            {"step": step, "total_steps": 40, "loss": 3.0 - 0.02 * step, "wan_bytes_sent": per_step * step},
        )


@needs_chromium
@pytest.mark.postgres
def test_map_queue_costs_and_tenants_pages_in_chromium(standby_server: ServerHandle, tmp_path: Path) -> None:
    server = standby_server
    with CpnClient(server.http_url, ADMIN_KEY) as admin:
        seed_fleet(server, admin)
        token = admin.create_token("borealis", note="tests", max_uses=1)["token"]
        register_node(
            server,
            token,
            region="us-east",
            cluster="virginia-1",
            price=3.0,
            jurisdiction="US",
            provider="borealis",
        )
        measure_link(server, "eu-north", "eu-west")
        tenant, research = new_tenant(admin, server, "research")
        spare = admin.create_key(tenant["id"])
        spare_ok = admin.create_key(tenant["id"])
        spec = {**small_spec("wan-job", steps=40), "parallelism": {"dp": 4, "tp": 1, "pp": 1}}
        job_id = research.submit(spec=spec, choice="cheapest")["id"]
        waiting = [
            research.submit(spec=small_spec(f"queued-{i}", steps=20), choice="cheapest")["id"]
            for i in range(2)
        ]
    with server.ctx.session_factory() as s, s.begin():
        revoke_api_key(s, spare["id"])
    assert place_job(server.ctx, job_id) == "placed"  # as the leading replica's placer would
    with CpnClient(server.http_url, ADMIN_KEY) as admin:
        job = admin.job(job_id)
        assert {t["region"] for t in job["tasks"]} == {"eu-north", "eu-west"}
        assert [admin.job(j)["status"] for j in waiting] == [JobState.PENDING] * 2
    for t in job["tasks"]:
        on_task_status(server.ctx, t["node_id"], t["id"], "running")
    began = time.monotonic()
    for step in range(1, 4):  # 1 MB a step per leader, steps at least 0.3 s apart
        if step > 1:
            time.sleep(0.3)
        _wan_metrics(server, job, step, per_step=1_000_000)
    # each leader sent 2 MB between its first and last line, which were 0.6 s to `elapsed` apart
    elapsed = time.monotonic() - began

    base = server.http_url
    for page in ("map", "queue", "costs", "tenants"):  # admins only, outside development
        full = httpx.get(f"{base}/dashboard/{page}", timeout=10)
        assert full.status_code == 401 and "Admin sign-in" in full.text and "research" not in full.text
        assert httpx.get(f"{base}/dashboard/fragments/{page}", timeout=10).status_code == 401
    with httpx.Client(base_url=base, timeout=10) as member:
        assert member.post("/dashboard/login", data={"key": spare_ok["key"]}).status_code == 403

    browser = Browser(tmp_path / "profile")
    try:
        _sign_in(browser, base)
        text = _visit(browser, base, "/dashboard/map", "map.png")
        assert "Region map" in text
        for region in ("eu-west", "eu-north", "us-east"):
            assert browser.evaluate(
                f"!!document.querySelector('svg.region-map g.region[data-region=\"{region}\"]')"
            )
        link = 'document.querySelector(\'svg.region-map g.link[data-src="{}"][data-dst="{}"]\')'
        measured, declared = link.format("eu-north", "eu-west"), link.format("eu-west", "eu-north")
        assert browser.evaluate(f"{measured}.classList.contains('measured')")
        assert browser.evaluate(f"{measured}.querySelector('line').getAttribute('stroke-dasharray')") is None
        assert browser.evaluate(f"{declared}.querySelector('line').getAttribute('stroke-dasharray')") == "7 5"
        # Both leaders send to each other (a pair): each link carries its sender's whole rate.
        for lk in (measured, declared):
            use = float(browser.evaluate(f"{lk}.dataset.use"))
            assert 2e6 / elapsed * 0.99 <= use <= 2e6 / 0.6 * 1.01, (use, elapsed)
        assert "in use" in browser.evaluate(
            "document.querySelector('svg.region-map .link-labels').textContent"
        )
        north = "document.querySelector('svg.region-map g.region[data-region=\"eu-north\"]').dataset"
        assert browser.evaluate(f"{north}.used") == "2" and browser.evaluate(f"{north}.free") == "0"
        assert browser.evaluate(f"{link.format('eu-west', 'us-east')}") is None  # no link declared there

        text = _visit(browser, base, "/dashboard/queue", "queue.png")
        rows = browser.evaluate(
            "Array.from(document.querySelectorAll('tr.queue-row'))"
            ".map(r => [r.dataset.position, r.dataset.jobId])"
        )
        assert rows == [["1", waiting[0]], ["2", waiting[1]]]
        assert "research" in text and "queued-0" in text and "waiting for the placer" in text

        browser.open(f"{base}/dashboard/jobs/{job_id}", f"/dashboard/jobs/{job_id}")
        assert browser.console_errors() == []
        edges = browser.evaluate(
            "Array.from(document.querySelectorAll('#job-map path.sync-edge'))"
            ".map(p => p.dataset.src + '>' + p.dataset.dst)"
        )
        assert sorted(edges) == ["eu-north>eu-west", "eu-west>eu-north"]
        in_job = (
            "Array.from(document.querySelectorAll('#job-map g.region.in-job')).map(g => g.dataset.region)"
        )
        assert sorted(browser.evaluate(in_job)) == ["eu-north", "eu-west"]
        assert browser.evaluate(
            "document.querySelector('#job-map g.region[data-region=\"us-east\"]')"
            ".classList.contains('dimmed')"
        )
        assert browser.evaluate("document.querySelector('#job-map g.in-job').dataset.jobDevices") == "2"
        browser.screenshot(SHOTS / "job-placement.png")

        # The job ends: the ledger charges it, by tenant and by the providers' clusters.
        for t in job["tasks"]:
            on_task_status(
                server.ctx,
                t["node_id"],
                t["id"],
                "succeeded",
                exit_code=0,
                result={"wan_bytes_sent": 3_000_000},
            )
        with CpnClient(server.http_url, ADMIN_KEY) as admin:
            cost = admin.job(job_id)["actual_cost"]
        assert cost and cost > 0
        text = _visit(browser, base, "/dashboard/costs", "costs.png")
        tenant_total = (
            "document.querySelector('#tenant-costs tr.cost-row[data-name=\"research\"]').dataset.total"
        )
        assert float(browser.evaluate(tenant_total)) == pytest.approx(cost, rel=1e-6)
        providers = browser.evaluate(
            "Array.from(document.querySelectorAll('#provider-costs tr.cost-row')).map(r => r.dataset.name)"
        )
        assert providers == ["acme"]  # both regions' clusters are acme's; borealis ran nothing
        provider_total = "document.querySelector('#provider-costs tr.cost-row').dataset.total"
        assert float(browser.evaluate(provider_total)) == pytest.approx(cost, rel=1e-6)

        text = _visit(browser, base, "/dashboard/tenants", "tenants.png")
        html = browser.evaluate("document.documentElement.outerHTML")
        with server.ctx.session_factory() as s:
            keys = list(s.query(ApiKey).all())
        assert keys and all(k.key_hash not in html for k in keys) and ADMIN_KEY not in html
        assert spare["key"] not in html
        revoked = f"document.querySelector('tr.key-row[data-key-id=\"{spare['id']}\"]')"
        assert browser.evaluate(f"{revoked}.classList.contains('revoked')")
        assert "revoked" in browser.evaluate(f"{revoked}.innerText")
        assert "research" in text and "admin" in text
        # the pages follow the fleet in place: a job placed now leaves the queue without a reload
        browser.open(f"{base}/dashboard/queue", "/dashboard/queue")
        browser.evaluate("window.__sameDocument = true")
        with CpnClient(server.http_url, ADMIN_KEY) as admin:
            admin.cancel(waiting[0])
        browser.wait_for("document.querySelectorAll('tr.queue-row').length === 1", timeout_s=15)
        assert browser.evaluate("window.__sameDocument") is True
        assert browser.console_errors() == []
    finally:
        browser.close()
