"""`POST /v1/jobs`'s short path (service_layer/fast_submit.py) answers as the route does, and
leaves to the route everything but a spec submission with a recently verified, permitted key."""

from __future__ import annotations

from typing import Any

import httpx

from orchestration.db.models import Job
from service_layer.client import CpnClient
from service_layer.key_cache import forget_everywhere
from service_layer.server import ServerHandle
from tests.service_layer.harness import ADMIN_KEY, count_rows, new_tenant, small_spec


def _submissions(server: ServerHandle, path: str) -> float:
    value = server.ctx.metrics.registry.get_sample_value("cpn_submissions_total", {"path": path})
    return value or 0.0


def _comparable(answer: dict[str, Any]) -> dict[str, Any]:
    """An answer without what differs between two submissions of one spec."""
    return {k: v for k, v in answer.items() if k not in ("id", "created_at", "queue")} | {
        "queue": {"reason": answer["queue"]["reason"]}
    }


def test_the_short_path_answers_as_the_route(server: ServerHandle, admin: CpnClient) -> None:
    tenant, alice = new_tenant(admin, server, "alice")
    key = alice._http.headers["authorization"]
    http = httpx.Client(base_url=server.http_url, headers={"Authorization": key}, timeout=30)
    spec = small_spec("same", steps=5)

    forget_everywhere()  # an unverified key: the route answers, and verifies it
    by_route = http.post("/v1/jobs", json={"spec": spec})
    assert (_submissions(server, "route"), _submissions(server, "short")) == (1, 0)
    forget_everywhere()
    assert http.get("/v1/queue").status_code == 200  # any request verifies the key ...
    by_short = http.post("/v1/jobs", json={"spec": spec, "choice": "cheapest"})  # ... for the short path
    assert (_submissions(server, "route"), _submissions(server, "short")) == (1, 1)

    assert by_route.status_code == by_short.status_code == 201
    assert by_route.headers["content-type"] == by_short.headers["content-type"] == "application/json"
    a, b = by_route.json(), by_short.json()
    assert a["id"] != b["id"] and b["queue"]["position"] == a["queue"]["position"] + 1
    assert _comparable(a) == _comparable(b)
    assert alice.job(b["id"])["tenant_id"] == tenant["id"]
    # the request is timed under the route's own label
    metrics = httpx.get(f"{server.http_url}/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"}).text
    timed = 'cpn_http_request_duration_seconds_count{method="POST",route="/v1/jobs",status="201"} 2.0'
    assert timed in metrics

    # What the short path does not answer goes to the route, body and all, with the route's answers.
    jobs_before = count_rows(server)
    bad = http.post("/v1/jobs", json={"spec": {**spec, "training": {**spec["training"], "steps": 0}}})
    assert bad.status_code == 422 and "training.steps" in bad.text
    not_json = http.post("/v1/jobs", content=b"{nope", headers={"content-type": "application/json"})
    assert not_json.status_code == 422
    unknown_quote = http.post("/v1/jobs", json={"quote_id": "no-such-quote"})
    forget_everywhere()
    assert (unknown_quote.status_code, unknown_quote.json()) == (
        (route := http.post("/v1/jobs", json={"quote_id": "no-such-quote"})).status_code,
        route.json(),
    )
    assert unknown_quote.status_code in (404, 422)
    operator = admin._call("POST", "/v1/keys", json={"role": "operator"})["key"]
    for _ in range(2):  # the first verifies the key, the second finds it verified: both 403
        denied = httpx.post(
            f"{server.http_url}/v1/jobs", json={"spec": spec}, headers={"Authorization": f"Bearer {operator}"}
        )
        assert denied.status_code == 403 and denied.json()["code"] == "permission_denied"
    assert httpx.post(f"{server.http_url}/v1/jobs", json={"spec": spec}).status_code == 401
    assert count_rows(server) == jobs_before
    assert (_submissions(server, "route"), _submissions(server, "short")) == (1, 1)

    # A refusal on the short path is the route's error body: 402 naming the numbers.
    admin.set_quota(tenant["id"], max_devices=None, max_monthly_spend=0.0)
    with server.ctx.session_factory() as session:  # this month's spend (the job has ended by now)
        job = session.get(Job, a["id"])
        assert job is not None
        job.estimated_cost = job.actual_cost = 2.5
        session.commit()
    refused = http.post("/v1/jobs", json={"spec": spec})
    assert refused.status_code == 402, refused.text
    body = refused.json()
    assert body["code"] == "payment_required" and body["details"]["month_spend"] == 2.5
    assert count_rows(server) == jobs_before
