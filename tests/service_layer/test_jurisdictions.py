"""Operator-approved jurisdictions: an agent only claims one; an admin sets it (REST and CLI),
audited; data residency trusts only what an admin set; an agent claiming another is refused."""

from __future__ import annotations

import json

import grpc
import pytest
from typer.testing import CliRunner

from cpn.cli import app
from service_layer.client import ApiError, CpnClient
from service_layer.server import ServerHandle
from tests.service_layer.harness import ADMIN_KEY, new_tenant, register_node, small_spec

BOTH_DATABASES = pytest.mark.parametrize(
    "db_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)


def _regions(client: CpnClient) -> dict[str, dict]:
    return {r["name"]: r for r in client.regions()}


def _refused(server: ServerHandle, token: str, **kw: str) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        register_node(server, token, price=1.0, **kw)  # type: ignore[arg-type]
    return err.value


@BOTH_DATABASES
def test_a_claim_is_untrusted_until_an_admin_sets_it_and_a_contrary_claim_is_refused(
    server: ServerHandle, admin: CpnClient
) -> None:
    token = admin.create_token("acme", max_uses=10)["token"]
    register_node(server, token, region="eu-west", cluster="paris-1", price=1.0, jurisdiction="EU")
    eu = _regions(admin)["eu-west"]
    assert (eu["jurisdiction"], eu["jurisdiction_approved"]) == ("EU", False)
    snap = admin.snapshot()
    region = next(r for r in snap["regions"] if r["name"] == "eu-west")
    assert (region["jurisdiction"], region["jurisdiction_claim"]) == ("", "EU")
    # Data residency does not trust the claim, and says so.
    with pytest.raises(ApiError) as none:
        admin.quote(small_spec(data_residency="EU"))
    residency = next(e for e in none.value.details["explanation"] if e["constraint"] == "qos.data_residency")
    assert "['eu-west'] only claim it" in residency["detail"], residency

    # A second agent claiming another jurisdiction for the region is refused, with the reason.
    err = _refused(server, token, region="eu-west", cluster="paris-2", jurisdiction="US")
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION  # type: ignore[attr-defined]
    assert "'EU' (claimed by its first agent, not yet approved); this agent claims 'US'" in err.details()  # type: ignore[attr-defined]

    # Only admins set it; bad input is a 422 naming the field and changes nothing.
    _, alice = new_tenant(admin, server, "alice")
    with pytest.raises(ApiError) as member:
        alice.set_jurisdiction("eu-west", "US")
    assert member.value.status == 403
    for region_name, value, field in (("eu-west", "eu", "jurisdiction"), ("EU West", "EU", "path.name")):
        with pytest.raises(ApiError) as bad:
            admin.set_jurisdiction(region_name, value)
        assert bad.value.status == 422 and bad.value.details["errors"][0]["field"] == field, bad.value.details
    assert _regions(admin)["eu-west"]["jurisdiction_approved"] is False

    approved = admin.set_jurisdiction("eu-west", "EU", reason="contract 114")
    assert (approved["jurisdiction"], approved["jurisdiction_approved"], approved["alive_nodes"]) == (
        "EU",
        True,
        1,
    )
    assert admin.quote(small_spec(data_residency="EU"))["options"]
    # From now on, and after a change, only the admin's jurisdiction is accepted.
    err = _refused(server, token, region="eu-west", cluster="paris-2", jurisdiction="US")
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "set by an admin" in err.details()  # type: ignore[attr-defined]
    register_node(server, token, region="eu-west", cluster="paris-2", price=1.0, jurisdiction="")  # no claim
    # Ahead of any agent: the region is created with it, and its first agent must agree.
    assert admin.set_jurisdiction("ch-north", "CH")["jurisdiction_approved"] is True
    err = _refused(server, token, region="ch-north", cluster="zurich-1", jurisdiction="EU")
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION  # type: ignore[attr-defined]
    register_node(server, token, region="ch-north", cluster="zurich-1", price=1.0, jurisdiction="CH")

    log = admin._call("GET", "/v1/audit", params={"action": "region.jurisdiction_set"})
    assert [(e["target"], e["details"]["jurisdiction"], e["details"]["before"]) for e in log] == [
        ("region eu-west", "EU", "EU"),
        ("region ch-north", "CH", ""),
    ]
    assert log[0]["details"]["before_approved"] is False and log[0]["details"]["reason"] == "contract 114"
    assert log[0]["actor_kind"] == "tenant" and log[1]["details"]["created"] is True
    claims = admin._call("GET", "/v1/audit", params={"action": "region.jurisdiction_claimed"})
    assert [(e["actor_kind"], e["target"], e["details"]["jurisdiction"]) for e in claims] == [
        ("node", "region eu-west", "EU"),
    ]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_cpn_regions_from_the_cli(server: ServerHandle, admin: CpnClient) -> None:
    token = admin.create_token("acme")["token"]
    register_node(server, token, region="us-east", cluster="virginia-1", price=1.0, jurisdiction="US")
    env = {"CPN_SERVER_URL": server.http_url, "CPN_API_KEY": ADMIN_KEY, "COLUMNS": "200"}
    out = CliRunner().invoke(app, ["regions", "list"], env=env)
    assert out.exit_code == 0 and "US (claimed, unapproved)" in out.output, out.output
    out = CliRunner().invoke(
        app, ["regions", "set-jurisdiction", "us-east", "US", "--reason", "checked", "--json"], env=env
    )
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["jurisdiction_approved"] is True
    out = CliRunner().invoke(app, ["regions", "set-jurisdiction", "us-east", "us"], env=env)
    assert out.exit_code != 0 and "422" in out.output, out.output
    assert "US (approved)" in CliRunner().invoke(app, ["regions", "list"], env=env).output
