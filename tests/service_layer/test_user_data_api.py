"""Users' code and data over REST: each bad reference is a 422 naming its field, at quote and at
submission, and stores nothing; good ones are quoted with their staging priced.

The artifact store's metadata is reached through ``control_layer.user_data.ArtifactLookup``; here
its in-memory implementation (``MemoryArtifacts``) stands in for the store's table. The https
source is a real HTTP server on loopback (plain http is allowed there).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from sqlalchemy import select

from control_layer.user_data import MemoryArtifacts
from orchestration.db.models import Task
from service_layer.client import ApiError, CpnClient
from service_layer.server import ServerHandle
from tests.service_layer.harness import count_rows, new_tenant, seed_fleet, small_spec, wait_placed

CODE = "sha256:" + "c" * 64
SHARD = "sha256:" + "5" * 64
DATA_BYTES = 123_456


class _Data(BaseHTTPRequestHandler):
    def do_HEAD(self) -> None:  # noqa: N802 (http.server's name)
        if self.path != "/tokens.bin":
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(DATA_BYTES))
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def data_url() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Data)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _user_spec(name: str = "user-job", **data: Any) -> dict[str, Any]:
    spec = small_spec(name)
    spec["entrypoint"] = "train:build"
    spec["code"] = {"digest": CODE}
    spec["data"] = {"kind": "tokens", **data}
    return spec


def _refused(call: Any, field: str) -> ApiError:
    with pytest.raises(ApiError) as info:
        call()
    assert info.value.status == 422, info.value
    assert info.value.details.get("field") == field, info.value
    assert field in info.value.message
    return info.value


@pytest.fixture
def tenants(server: ServerHandle, admin: CpnClient) -> Iterator[tuple[CpnClient, MemoryArtifacts]]:
    seed_fleet(server, admin)  # regions eu-west and eu-north
    alice_row, alice = new_tenant(admin, server, "alice")
    bob_row, bob = new_tenant(admin, server, "bob")
    store = MemoryArtifacts()
    store.add(alice_row["id"], CODE, 4096)
    store.add(alice_row["id"], SHARD, 10**6)
    store.add(bob_row["id"], "sha256:" + "b" * 64, 10)  # bob's, not alice's
    server.ctx.artifact_lookup = store
    with alice, bob:
        yield alice, store


def test_each_bad_reference_is_422_naming_the_field_and_stores_nothing(
    server: ServerHandle, tenants: tuple[CpnClient, MemoryArtifacts], data_url: str
) -> None:
    alice, _ = tenants
    before = count_rows(server)
    cases = [
        (_user_spec(shards={"mars-1": {"uri": f"artifact:{SHARD}"}}), "data.shards.mars-1"),
        (
            {**_user_spec(source=f"{data_url}/tokens.bin"), "code": {"digest": "sha256:" + "9" * 64}},
            "code.digest",
        ),
        # another tenant's upload is not this tenant's
        (_user_spec(source="artifact:sha256:" + "b" * 64), "data.source"),
        (_user_spec(shards={"eu-west": {"uri": "artifact:sha256:" + "7" * 64}}), "data.shards.eu-west.uri"),
        (_user_spec(source=f"http://127.0.0.1:{_closed_port()}/tokens.bin"), "data.source"),
        (_user_spec(source=f"{data_url}/missing.bin"), "data.source"),
        (_user_spec(source="s3://some-bucket/tokens.bin"), "data.source"),  # no S3 store configured
        (
            {**_user_spec(source=f"{data_url}/tokens.bin"), "outputs": {"uri": "s3://other-bucket/x/"}},
            "outputs.uri",
        ),
    ]
    for spec, field in cases:
        _refused(lambda spec=spec: alice.quote(spec), field)
        _refused(lambda spec=spec: alice.submit(spec=spec, choice="cheapest"), field)
    assert count_rows(server) == before


def test_outputs_allow_list_lets_a_tenant_write_there(
    server: ServerHandle, tenants: tuple[CpnClient, MemoryArtifacts], data_url: str
) -> None:
    alice, _ = tenants
    spec = {
        **_user_spec(source=f"{data_url}/tokens.bin"),
        "outputs": {"uri": "s3://team-bucket/models/run1/"},
    }
    _refused(lambda: alice.quote(spec), "outputs.uri")
    server.ctx.settings = server.ctx.settings.model_copy(
        update={"outputs_allow": ["s3://team-bucket/models"]}
    )
    assert alice.quote(spec)["options"]
    spec["outputs"]["uri"] = "s3://team-bucket/modelsx/"  # a sibling of the allowed prefix is not under it
    _refused(lambda: alice.quote(spec), "outputs.uri")


def test_good_references_are_quoted_with_staging_and_submitted(
    server: ServerHandle, tenants: tuple[CpnClient, MemoryArtifacts], data_url: str
) -> None:
    alice, _ = tenants
    before = count_rows(server)
    quote = alice.quote(_user_spec(source=f"{data_url}/tokens.bin"))
    for option in quote["options"]:
        est = option["estimates"]
        staging = est["staging"]
        assert est["staging_s"] == staging["seconds"] > 0
        nodes = {t["node"] for t in option["tasks"]}
        assert {r["node"] for r in staging["reads"]} == nodes
        for read in staging["reads"]:
            assert read["items"] == ["code", "data.source"] and read["bytes"] == 4096 + DATA_BYTES
            # No agent measured staging here: two fetches at the default fixed seconds, the link's rate.
            assert read["fetches"] == 2 and read["fixed_basis"] == "default"
            fixed = read["fetches"] * read["fetch_fixed_s"]
            assert read["seconds"] == pytest.approx(
                fixed + read["bytes"] / read["bytes_per_s"] + read["venv_s"]
            )
        assert "staging_egress" in est["cost"]
    shards = _user_spec(shards={"eu-west": {"uri": f"artifact:{SHARD}", "resident": True}})
    resident = alice.quote(shards)
    for option in resident["options"]:
        assert {t["region"] for t in option["tasks"]} == {"eu-west"}  # every shard resident there
        assert any(c["name"] == "resident_shards" and c["ok"] for c in option["qos_checks"])
    job = alice.submit(spec=_user_spec("submitted", source=f"{data_url}/tokens.bin"), choice="cheapest")
    assert job["status"] in ("queued", "placed")
    assert count_rows(server) == (before[0] + 2, before[1] + 1)
    assert wait_placed(alice, job["id"])["status"] == "placed"
    with server.ctx.session_factory() as session:
        configs = [t.worker_config for t in session.scalars(select(Task).where(Task.job_id == job["id"]))]
    assert configs
    for config in configs:
        stage = config["stage"]
        assert (
            stage["code"]["digest"] == CODE
            and f"/v1/artifacts/content/{CODE}?ticket=" in stage["code"]["url"]
        )
        assert stage["data"]["url"] == f"{data_url}/tokens.bin" and stage["data"]["bytes"] == DATA_BYTES
        assert stage["sandbox"] is True
    assert sum(bool(c["stage"]["outputs"]) for c in configs) == 1
