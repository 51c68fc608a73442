"""/metrics speaks Prometheus' text format, needs an admin key outside development, and reports
the database's truth (jobs by state, nodes) beside request latencies."""

from __future__ import annotations

import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from service_layer.server import ServerHandle
from tests.service_layer.harness import ADMIN_KEY

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def _families(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Family name -> (labels, value) of its plain samples; a histogram's are its ``_count``s, a
    counter's its ``_total``s."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for f in text_string_to_metric_families(text):
        keep = {"histogram": f.name + "_count", "counter": f.name + "_total"}.get(f.type, f.name)
        out[f.name] = [(s.labels, s.value) for s in f.samples if s.name == keep]
    return out


def test_metrics_report_requests_jobs_and_nodes(server: ServerHandle) -> None:
    auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    with httpx.Client(base_url=server.http_url, timeout=10, headers=auth) as client:
        assert client.get("/v1/jobs").status_code == 200
        assert client.get("/v1/jobs/nope").status_code == 404
        r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    fams = _families(r.text)
    counts = {
        (labels["route"], labels["status"]): value
        for labels, value in fams["cpn_http_request_duration_seconds"]
        if "le" not in labels and labels.get("method") == "GET" and "route" in labels
    }
    assert counts[("/v1/jobs", "200")] >= 1
    assert counts[("/v1/jobs/{job_id}", "404")] >= 1  # the template, not the id
    jobs = {labels["state"]: value for labels, value in fams["cpn_jobs"]}
    assert set(jobs) >= {"queued", "running", "succeeded", "failed"} and all(v == 0 for v in jobs.values())
    assert fams["cpn_queue_length"] == [({}, 0.0)]


def test_metrics_need_an_admin_key_outside_loopback_development(server: ServerHandle) -> None:
    server.ctx.settings.environment = "production"
    try:
        assert httpx.get(server.http_url + "/metrics", timeout=10).status_code == 401
        auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
        assert httpx.get(server.http_url + "/metrics", headers=auth, timeout=10).status_code == 200
    finally:
        server.ctx.settings.environment = "development"


def test_sample_alert_rules_name_only_metrics_the_server_exports(server: ServerHandle) -> None:
    import re
    from pathlib import Path

    import yaml

    rules = yaml.safe_load((Path(__file__).parents[2] / "deploy/prometheus/alerts.yml").read_text())
    exprs = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    assert len(exprs) >= 6
    auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    text = httpx.get(server.http_url + "/metrics", headers=auth, timeout=10).text
    exported = {m.group(1) for m in re.finditer(r"^# TYPE (\S+) (\S+)", text, flags=re.M)}
    exported |= {f"{n}_{suffix}" for n in exported for suffix in ("bucket", "count", "sum", "total")}
    for expr in exprs:
        for name in re.findall(r"\b(cpn_[a-z_]+)", expr):
            assert name in exported, f"{name} in {expr!r} is not exported"


def test_placements_are_counted_by_outcome(server: ServerHandle) -> None:
    from contracts.states import JobState
    from control_layer.lifecycle import wake_placer
    from orchestration.db.engine import session_scope
    from orchestration.db.models import Job, Tenant
    from tests.service_layer.harness import small_spec

    with session_scope(server.ctx.session_factory) as session:
        admin = session.query(Tenant).filter(Tenant.is_admin).one()
        session.add(Job(tenant_id=admin.id, name="lonely", spec=small_spec("lonely"), status=JobState.QUEUED))
        wake_placer(session, server.ctx.bus, "test")  # as a submission does
    # The server's own placer (it leads) takes the job: no fleet, so the planner finds nothing and
    # the job fails. Calling place_pending here would race it: only the leader places.
    auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    deadline = time.monotonic() + 30
    while True:
        fams = _families(httpx.get(server.http_url + "/metrics", headers=auth, timeout=10).text)
        outcomes = {labels["outcome"]: value for labels, value in fams["cpn_placement_duration_seconds"]}
        if outcomes:  # observed once the placement is over
            break
        assert time.monotonic() < deadline, "the placer did not take the job"
        time.sleep(0.1)
    assert outcomes == {"failed": 1.0}
    assert {labels["state"]: v for labels, v in fams["cpn_jobs"]}["failed"] == 1


def test_the_only_replica_leads_and_says_so(server: ServerHandle) -> None:
    auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    deadline = time.monotonic() + 20
    while True:
        fams = _families(httpx.get(server.http_url + "/metrics", headers=auth, timeout=10).text)
        if fams["cpn_leader"] == [({}, 1.0)]:
            break
        assert time.monotonic() < deadline, fams["cpn_leader"]
        time.sleep(0.1)


def test_wan_bytes_sent_count_billed_and_running_work_by_region(server: ServerHandle) -> None:
    """The counter adds the egress metered (billed) so far and what running tasks reported beyond
    it, and does not fall when a running task is metered or its job finishes and is billed."""
    from contracts.states import JobState, TaskState
    from orchestration.db.base import utcnow
    from orchestration.db.engine import session_scope
    from orchestration.db.models import Job, Task, Tenant
    from orchestration.ledger import close_job, meter_job
    from tests.orchestration.fleet import add_cluster
    from tests.service_layer.harness import small_spec

    def scrape() -> dict[str, float]:
        auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
        text = httpx.get(server.http_url + "/metrics", headers=auth, timeout=10).text
        return {labels["region"]: v for labels, v in _families(text)["cpn_wan_bytes_sent"]}

    def task(job: Job, cluster_id: str, node_id: str, region: str, sent: int, **kw: object) -> Task:
        return Task(
            job_id=job.id,
            attempt=1,
            cluster_id=cluster_id,
            node_id=node_id,
            region=region,
            device_indices=[0],
            placement=[],
            worker_config={},
            egress_price_per_gb=0.02,
            last_metrics={"step": 7, "wan_bytes_sent": sent},
            **kw,
        )

    assert scrape() == {}
    with session_scope(server.ctx.session_factory) as session:
        admin = session.query(Tenant).filter(Tenant.is_admin).one()
        cluster, (node,) = add_cluster(session, region="eu-west")
        us, (us_node,) = add_cluster(session, region="us-east")
        done = Job(tenant_id=admin.id, name="done", spec=small_spec("done"), status=JobState.SUCCEEDED)
        running = Job(tenant_id=admin.id, name="run", spec=small_spec("run"), status=JobState.RUNNING)
        session.add_all([done, running])
        session.flush()
        # an ended job's task, its egress metered in full
        session.add(
            task(
                done,
                us.id,
                us_node.id,
                "us-east",
                2500,
                status=TaskState.SUCCEEDED,
                metered_egress_bytes=2500,
            )
        )
        session.add(
            task(running, cluster.id, node.id, "eu-west", 4096, status=TaskState.RUNNING, started_at=utcnow())
        )
        running_id = running.id
    assert scrape() == {"us-east": pytest.approx(2500.0), "eu-west": 4096.0}
    with session_scope(server.ctx.session_factory) as session:
        job = session.get(Job, running_id)
        meter_job(session, job)  # a meter while it runs moves the bytes to the billed part
    assert scrape() == {"us-east": pytest.approx(2500.0), "eu-west": 4096.0}
    with session_scope(server.ctx.session_factory) as session:
        job = session.get(Job, running_id)
        (t,) = session.query(Task).filter(Task.job_id == running_id).all()
        t.last_metrics = {"step": 9, "wan_bytes_sent": 5000}
    assert scrape() == {"us-east": pytest.approx(2500.0), "eu-west": 5000.0}
    with session_scope(server.ctx.session_factory) as session:
        job = session.get(Job, running_id)
        job.status = JobState.SUCCEEDED
        close_job(session, job)  # as the lifecycle does in the transaction that ends the job
        assert job.actual_cost == pytest.approx(5000 / 1e9 * 0.02, abs=1e-6)
    assert scrape() == {"us-east": pytest.approx(2500.0), "eu-west": 5000.0}
