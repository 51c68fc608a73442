"""Every route declares who may call it, and each role gets exactly what docs/api.md's role table says."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute, iter_route_contexts
from starlette.routing import Mount

from contracts.roles import Permission
from orchestration.context import ServerContext
from orchestration.settings import Settings
from service_layer.app import create_app
from service_layer.client import ApiError, CpnClient
from service_layer.server import ServerHandle, start_server_in_thread
from tests.service_layer.harness import ADMIN_KEY, new_tenant, register_node

# Routes outside the role table, each for a reason: open by design, or guarded by its own check.
NOT_BY_ROLE = {
    "/healthz": "liveness for load balancers: open",
    "/metrics": "admin key checked in the handler (open on loopback in development)",
    "/": "a redirect to the dashboard",
    "/openapi.json": "the API's description: open",
    "/docs": "the API's description: open",
    "/docs/oauth2-redirect": "the API's description: open",
    "/redoc": "the API's description: open",
    "/v1/artifacts/content/{digest}": "agents: a signed get ticket, checked in the handler",
    "/v1/jobs/{job_id}/outputs/{name}": "agents: a signed put ticket, checked in the handler",
}


def permissions_of(dependant: Dependant) -> list[Permission]:
    found = [d.call.permission for d in dependant.dependencies if hasattr(d.call, "permission")]
    for d in dependant.dependencies:
        found += permissions_of(d)
    return found


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_every_route_declares_exactly_one_permission(ctx: ServerContext) -> None:
    app = create_app(ctx)
    unguarded, seen = [], set()
    # The routes as served, prefixes included (FastAPI keeps included routers unflattened).
    for route in iter_route_contexts(app.routes):
        if isinstance(route.original_route, Mount):
            continue  # static files
        path = route.path or ""
        seen.add(path)
        if path.startswith("/dashboard") or path in NOT_BY_ROLE:
            continue  # the dashboard checks an admin's signed cookie on every page (its own tests)
        original = route.original_route
        assert isinstance(original, APIRoute), path
        found = permissions_of(original.dependant)
        if len(found) != 1:
            unguarded.append((sorted(route.methods or ()), path, found))
    assert unguarded == [], f"routes without exactly one permission: {unguarded}"
    assert set(NOT_BY_ROLE) <= seen, "an exempted route no longer exists: drop it from NOT_BY_ROLE"
    assert any(p.startswith("/v1/keys") for p in seen) and "/v1/nodes/{node_id}/drain" in seen


def _status(call: Any) -> int:
    try:
        call()
    except ApiError as exc:
        return exc.status
    return 200


def test_each_role_gets_what_the_table_says(server: ServerHandle, admin: CpnClient) -> None:
    acme, boss = new_tenant(admin, server, "acme")  # its first key: tenant-admin
    other, rival = new_tenant(admin, server, "rival")
    platform = next(t for t in admin._call("GET", "/v1/tenants") if t["is_admin"])
    op_key = admin.add_key(role="operator", name="ops-1", tenant_id=platform["id"])
    assert op_key["role"] == "operator" and op_key["tenant_id"] == platform["id"]
    with boss, rival, CpnClient(server.http_url, op_key["key"]) as operator:
        member_key = boss.add_key(name="ana")  # member by default
        assert (member_key["role"], member_key["name"], member_key["tenant_id"]) == (
            "member",
            "ana",
            acme["id"],
        )
        with CpnClient(server.http_url, member_key["key"]) as member:
            # member: own jobs; nothing of keys or the fleet
            assert member.jobs() == [] and member.regions() == []
            for call in (member.keys, member.tokens, lambda: member.add_key(), member.snapshot):
                assert _status(call) == 403
            with pytest.raises(ApiError) as denied:
                member.node_action("nope", "cordon")
            assert denied.value.status == 403
            assert "admin or operator" in denied.value.message and "member" in denied.value.message

            # tenant-admin: own keys only, roles up to its own
            own = boss.keys()
            assert {k["id"] for k in own} == {k["id"] for k in admin.keys(acme["id"])}
            assert _status(lambda: boss.keys(other["id"])) == 403
            assert _status(lambda: boss.add_key(role="operator")) == 403
            assert _status(lambda: boss.add_key(role="admin")) == 403
            assert _status(lambda: boss.add_key(tenant_id=other["id"])) == 403
            rival_key = rival.keys()[0]["id"]
            assert _status(lambda: boss.revoke_key(rival_key)) == 404  # another tenant's reads as absent
            assert _status(lambda: boss.node_action("nope", "drain")) == 403
            assert _status(lambda: boss.create_token("acme")) == 403

            # operator: the fleet, not tenants' jobs or keys
            assert operator.tokens() == [] and "clusters" in operator.snapshot()
            for call in (operator.jobs, operator.keys, lambda: operator.add_key(), admin_only(operator)):
                assert _status(call) == 403
            assert _status(lambda: operator.node_action("nope", "cordon")) == 404
            # past the role check, to the domain's own answer (no such region yet)
            assert (
                _status(lambda: operator.put_link(src="eu-a", dst="eu-b", bandwidth_gbps=1, latency_ms=5))
                == 404
            )
            assert (
                _status(lambda: member.put_link(src="eu-a", dst="eu-b", bandwidth_gbps=1, latency_ms=5))
                == 403
            )

            # revocation: the member's key fails at once on this replica
            revoked = boss.revoke_key(member_key["id"])
            assert revoked["revoked_at"] is not None
            assert _status(member.jobs) == 401
            assert boss.revoke_key(member_key["id"])["revoked_at"] == revoked["revoked_at"]  # a no-op

        # bad input: 422 naming the field, nothing created
        before = len(admin.keys())
        with httpx.Client(base_url=server.http_url, timeout=10) as raw:
            auth = {"Authorization": f"Bearer {boss._http.headers['authorization'][7:]}"}
            for body in ({"role": "root"}, {"name": "x" * 65}, {"role": "member", "extra": 1}):
                r = raw.post("/v1/keys", json=body, headers=auth)
                assert r.status_code == 422, (body, r.text)
        assert len(admin.keys()) == before

    actions = [e["action"] for e in admin._call("GET", "/v1/audit", params={"limit": 1000})]
    assert {"key.created", "key.revoked"} <= set(actions)


def admin_only(client: CpnClient) -> Any:
    return lambda: client._call("GET", "/v1/tenants")


def test_a_revoked_enrollment_token_enrolls_nothing(server: ServerHandle, admin: CpnClient) -> None:
    token = admin.create_token("acme", max_uses=5)
    register_node(server, token["token"], region="eu-west", cluster="paris-1", price=1.0)
    listed = {t["id"]: t for t in admin.tokens()}
    assert listed[token["id"]]["uses"] == 1 and listed[token["id"]]["revoked_at"] is None
    assert admin.revoke_token(token["id"])["revoked_at"] is not None
    with pytest.raises(grpc.RpcError) as refused:
        register_node(server, token["token"], region="eu-west", cluster="paris-1", price=1.0)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert {t["id"]: t for t in admin.tokens()}[token["id"]]["uses"] == 1
    assert _status(lambda: admin.revoke_token("no-such-token")) == 404
    assert "token.revoked" in [e["action"] for e in admin._call("GET", "/v1/audit", params={"limit": 1000})]


@pytest.fixture
def prod_server(tmp_path: Path) -> Iterator[ServerHandle]:
    settings = Settings(
        environment="production",
        secret_key="s3cret-for-the-roles-test",
        data_dir=tmp_path / "data",
        http_port=0,
        grpc_port=0,
        admin_api_key=ADMIN_KEY,
    )
    handle = start_server_in_thread(settings)
    yield handle
    handle.stop()


def test_the_dashboard_takes_admin_keys_only_and_forgets_a_revoked_one(prod_server: ServerHandle) -> None:
    with CpnClient(prod_server.http_url, ADMIN_KEY) as admin:
        platform = next(t for t in admin._call("GET", "/v1/tenants") if t["is_admin"])
        operator = admin.add_key(role="operator", tenant_id=platform["id"])
        second_admin = admin.add_key(role="admin", name="sam", tenant_id=platform["id"])
        with httpx.Client(base_url=prod_server.http_url, timeout=10) as browser:
            assert browser.post("/dashboard/login", data={"key": operator["key"]}).status_code == 403
            assert browser.post("/dashboard/login", data={"key": second_admin["key"]}).status_code == 303
            assert browser.get("/dashboard").status_code == 200
            admin.revoke_key(second_admin["id"])
            assert browser.get("/dashboard").status_code == 401  # the session ends with its key
