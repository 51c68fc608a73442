"""`cpn keys`, `cpn tokens list|revoke` and `cpn nodes` against a live control plane."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cpn.cli import app
from service_layer.client import CpnClient
from service_layer.server import ServerHandle
from tests.service_layer.harness import ADMIN_KEY, register_node

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def _cpn(server: ServerHandle, key: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        app, list(args), env={"CPN_SERVER_URL": server.http_url, "CPN_API_KEY": key, "COLUMNS": "200"}
    )
    return result.exit_code, result.output


def test_keys_tokens_and_nodes_from_the_cli(server: ServerHandle, admin: CpnClient) -> None:
    code, out = _cpn(server, ADMIN_KEY, "tenants", "create", "dora", "--json")
    assert code == 0, out
    boss = json.loads(out)["key"]
    code, out = _cpn(server, boss["key"], "keys", "create", "--name", "ana", "--json")
    assert code == 0, out
    ana = json.loads(out)
    assert (ana["role"], ana["name"]) == ("member", "ana")
    code, out = _cpn(server, boss["key"], "keys", "list")
    assert code == 0 and "ana" in out and "member" in out and "tenant-admin" in out, out
    code, out = _cpn(server, ana["key"], "keys", "list")
    assert code != 0 and "403" in out, out
    code, out = _cpn(server, boss["key"], "keys", "revoke", ana["id"])
    assert code == 0 and "revoked" in out, out
    assert _cpn(server, ana["key"], "jobs", "list")[0] != 0

    token = admin.create_token("acme", max_uses=3)
    node = register_node(server, token["token"], region="eu-west", cluster="paris-1", price=1.0)
    measuring = register_node(
        server, token["token"], region="us-east", cluster="virginia-1", price=1.0, profile_follows=True
    )
    code, out = _cpn(server, ADMIN_KEY, "tokens", "list")
    assert code == 0 and token["id"] in out and "2/3 used" in out, out
    code, out = _cpn(server, ADMIN_KEY, "nodes", "list")
    assert code == 0, out
    lines = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}
    assert lines[node.node_id][1:2] + lines[node.node_id][3:5] == ["eu-west/paris-1", "alive", "open"], out
    assert lines[measuring.node_id][3] == "measuring", out
    code, out = _cpn(server, ADMIN_KEY, "nodes", "list", "--json")
    assert {n["id"]: n["status"] for n in json.loads(out)} == {
        node.node_id: "alive",
        measuring.node_id: "measuring",
    }
    code, out = _cpn(server, ADMIN_KEY, "tokens", "revoke", token["id"])
    assert code == 0 and "revoked" in out, out

    for action, cordon in (("cordon", "cordoned"), ("uncordon", "none"), ("drain", "draining")):
        code, out = _cpn(server, ADMIN_KEY, "nodes", action, node.node_id, "--reason", "test")
        assert code == 0 and f"cordon {cordon}" in out, out
    code, out = _cpn(server, ADMIN_KEY, "nodes", "revoke", node.node_id, "--json")
    assert code == 0 and json.loads(out)["status"] == "revoked", out
