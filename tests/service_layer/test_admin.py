"""Admin endpoints: tokens, tenants and keys, links, the snapshot; the OpenAPI document."""

from __future__ import annotations

import httpx
import pytest

from service_layer.client import ApiError, CpnClient
from service_layer.server import ServerHandle
from tests.service_layer.harness import register_node, seed_fleet


def test_tokens_tenants_links_and_snapshot(server: ServerHandle, admin: CpnClient) -> None:
    tok = admin.create_token("acme", note="rack 3", ttl_s=600, max_uses=1)
    assert tok["token"].startswith("cpn_enroll_") and tok["max_uses"] == 1 and tok["expires_at"]
    register_node(server, tok["token"], region="us-east", cluster="virginia-1", price=2.1, jurisdiction="US")
    with pytest.raises(Exception, match="UNAUTHENTICATED"):  # used up
        register_node(server, tok["token"], region="us-east", cluster="virginia-2", price=2.1)
    with pytest.raises(ApiError) as bad:
        admin.create_token("acme", ttl_s=-5)
    assert bad.value.status == 422 and bad.value.details["errors"][0]["field"] == "ttl_s"

    tenant = admin.create_tenant("acme")
    with pytest.raises(ApiError) as dup:
        admin.create_tenant("acme")
    assert dup.value.status == 409
    with pytest.raises(ApiError) as bad_name:
        admin.create_tenant("Not A Name")
    assert bad_name.value.status == 422 and bad_name.value.details["errors"][0]["field"] == "name"
    with pytest.raises(ApiError) as missing:
        admin.create_key("0" * 32)
    assert missing.value.status == 404
    key = admin.create_key(tenant["id"])
    with CpnClient(server.http_url, key["key"]) as acme:
        assert acme.jobs() == []

    with pytest.raises(ApiError) as unknown_region:
        admin.put_link(src="us-east", dst="atlantis", bandwidth_gbps=1, latency_ms=5)
    assert unknown_region.value.status == 404 and unknown_region.value.details["field"] == "dst"
    seed_fleet(server, admin)
    link = admin.put_link(
        src="eu-west", dst="us-east", bandwidth_gbps=0.5, latency_ms=80, egress_price_per_gb=0.05
    )
    assert link["bandwidth_gbps"] == 0.5
    again = admin.put_link(src="eu-west", dst="us-east", bandwidth_gbps=0.7, latency_ms=80)
    assert again["id"] == link["id"] and again["bandwidth_gbps"] == 0.7

    snap = admin.snapshot()
    assert {c["name"] for c in snap["clusters"]} == {"virginia-1", "paris-1", "stockholm-1"}
    assert {(ln["src"], ln["dst"]) for ln in snap["links"]} == {
        ("eu-west", "eu-north"),
        ("eu-west", "us-east"),
    }
    # The agent's jurisdiction is a claim the planner does not trust until an admin sets it.
    us = {r["name"]: r for r in snap["regions"]}["us-east"]
    assert (us["jurisdiction"], us["jurisdiction_claim"]) == ("", "US")
    admin.set_jurisdiction("us-east", "US")
    us = {r["name"]: r for r in admin.snapshot()["regions"]}["us-east"]
    assert (us["jurisdiction"], us["jurisdiction_claim"]) == ("US", "")


def test_links_are_public_unless_declared_private(server: ServerHandle, admin: CpnClient) -> None:
    """`private` is the providers' word, for the planner's groups across clusters: false unless
    given, a region's own network (src = dst) may be declared, and a bad flag is a 422 that
    changes nothing."""
    seed_fleet(server, admin)
    assert admin.put_link(src="eu-west", dst="eu-north", bandwidth_gbps=1, latency_ms=5)["private"] is False
    own = admin.put_link(src="eu-west", dst="eu-west", bandwidth_gbps=100, latency_ms=0.5, private=True)
    assert (own["src"], own["dst"], own["private"]) == ("eu-west", "eu-west", True)
    with pytest.raises(ApiError) as bad:
        admin.put_link(src="eu-west", dst="eu-north", bandwidth_gbps=1, latency_ms=5, private="yes")
    assert bad.value.status == 422 and bad.value.details["errors"][0]["field"] == "private"
    shown = {(ln["src"], ln["dst"]): ln["private"] for ln in admin.links()}
    assert shown == {("eu-west", "eu-north"): False, ("eu-west", "eu-west"): True}
    links = {(ln["src"], ln["dst"]): ln["private"] for ln in admin.snapshot()["links"]}
    assert links == shown


def test_openapi_is_complete_with_examples(server: ServerHandle) -> None:
    doc = httpx.get(server.http_url + "/openapi.json", timeout=10).json()
    paths = doc["paths"]
    for path, method in [
        ("/v1/quotes", "post"),
        ("/v1/jobs", "post"),
        ("/v1/jobs", "get"),
        ("/v1/jobs/{job_id}", "get"),
        ("/v1/jobs/{job_id}/cancel", "post"),
        ("/v1/jobs/{job_id}/events", "get"),
        ("/v1/regions", "get"),
        ("/v1/clusters", "get"),
        ("/v1/tokens", "post"),
        ("/v1/tenants", "post"),
        ("/v1/tenants/{tenant_id}/keys", "post"),
        ("/v1/snapshot", "get"),
        ("/v1/links", "put"),
        ("/v1/ledger/transactions", "get"),
        ("/v1/tenants/{tenant_id}/invoice", "get"),
        ("/v1/providers/{name}/statement", "get"),
        ("/healthz", "get"),
    ]:
        assert method in paths.get(path, {}), (path, method)
    for path in ("/v1/quotes", "/v1/jobs"):
        body = paths[path]["post"]["requestBody"]["content"]["application/json"]
        assert len(body["examples"]) >= 2, path
        assert {"401", "422"} <= set(paths[path]["post"]["responses"])
    # the body limit answers before any route, so every operation documents its 400 and 413
    for path, ops in paths.items():
        for method, op in ops.items():
            assert {"400", "413"} <= set(op["responses"]), (path, method)
    assert "text/event-stream" in paths["/v1/jobs/{job_id}/events"]["get"]["responses"]["200"]["content"]
    assert doc["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert "PlanOption" in doc["components"]["schemas"] and "JobSpec" in doc["components"]["schemas"]
