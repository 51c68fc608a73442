"""Bad or oversized input is refused at the edge, before it costs the server anything."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from service_layer.client import CpnClient
from service_layer.server import ServerHandle

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def test_a_body_over_the_limit_is_refused_before_authentication(server: ServerHandle) -> None:
    limit = server.ctx.settings.max_body_bytes
    with httpx.Client(base_url=server.http_url, timeout=30) as raw:
        # declared length: refused without reading, and without a key
        r = raw.post("/v1/jobs", content=b"x" * (limit + 1), headers={"content-type": "application/json"})
        assert r.status_code == 413 and r.json()["code"] == "payload_too_large"
        assert str(limit) in r.json()["message"]

        # streamed (chunked, no Content-Length): cut off once it passes the limit
        def chunks() -> Iterator[bytes]:
            for _ in range(64):
                yield b"y" * (limit // 8)

        r = raw.post("/v1/jobs", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413

        # under the limit it reaches authentication as before
        assert (
            raw.post("/v1/jobs", content=b"{}", headers={"content-type": "application/json"}).status_code
            == 401
        )


def test_405_names_the_allowed_methods(server: ServerHandle) -> None:
    r = httpx.delete(server.http_url + "/healthz", timeout=10)
    assert r.status_code == 405 and r.json()["code"] == "method_not_allowed"
    assert r.headers["allow"] == "GET"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ('{"provider": "acme", "ttl_s": 1e300}', "ttl_s"),
        ('{"provider": "acme", "ttl_s": Infinity}', "ttl_s"),
        ('{"provider": "acme", "ttl_s": NaN}', "ttl_s"),
        ('{"provider": "acme", "max_uses": 2147483648}', "max_uses"),
        ('{"max_uses": 2}', "provider"),
    ],
)
def test_token_numbers_out_of_bounds_get_a_422_naming_the_field(
    server: ServerHandle, body: str, field: str
) -> None:
    from tests.service_layer.harness import ADMIN_KEY

    headers = {"Authorization": f"Bearer {ADMIN_KEY}", "content-type": "application/json"}
    r = httpx.post(server.http_url + "/v1/tokens", content=body, headers=headers, timeout=10)
    assert r.status_code == 422, r.text
    assert [e["field"] for e in r.json()["details"]["errors"]] == [field]


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ('"bandwidth_gbps": Infinity', "bandwidth_gbps"),
        ('"bandwidth_gbps": 1e300', "bandwidth_gbps"),
        ('"latency_ms": NaN', "latency_ms"),
        ('"egress_price_per_gb": -0.1', "egress_price_per_gb"),
    ],
)
def test_link_figures_must_be_finite_and_bounded(
    server: ServerHandle, admin: CpnClient, patch: str, field: str
) -> None:
    from tests.service_layer.harness import ADMIN_KEY, seed_fleet

    seed_fleet(server, admin)  # both regions exist: only the figure can be refused
    before = admin.links()
    fields = {"bandwidth_gbps": "1", "latency_ms": "10", "egress_price_per_gb": "0.01"}
    name, value = patch.split(": ")
    fields[name.strip('"')] = value
    body = (
        '{"src": "eu-west", "dst": "eu-north", ' + ", ".join(f'"{k}": {v}' for k, v in fields.items()) + "}"
    )
    headers = {"Authorization": f"Bearer {ADMIN_KEY}", "content-type": "application/json"}
    r = httpx.put(server.http_url + "/v1/links", content=body, headers=headers, timeout=10)
    assert r.status_code == 422, r.text
    assert [e["field"] for e in r.json()["details"]["errors"]] == [field]
    assert admin.links() == before


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ('"data": {"seed": 1180591620717411303424}', "data.seed"),
        ('"sync": {"every": 1000000000000000000}', "sync.every"),
        ('"qos": {"max_cost": Infinity}', "qos.max_cost"),
    ],
)
def test_job_spec_numbers_out_of_bounds_get_a_422_not_a_500(
    server: ServerHandle, patch: str, field: str
) -> None:
    from tests.service_layer.harness import ADMIN_KEY

    body = (
        '{"name": "b", "model": {"n_layers": 1, "d_model": 8, "n_heads": 2, "vocab": 16, "seq_len": 4},'
        ' "training": {"steps": 2, "global_batch_tokens": 8}, ' + patch + "}"
    )
    headers = {"Authorization": f"Bearer {ADMIN_KEY}", "content-type": "application/json"}
    r = httpx.post(server.http_url + "/v1/quotes", content=body, headers=headers, timeout=10)
    assert r.status_code == 422, r.text
    assert [e["field"] for e in r.json()["details"]["errors"]] == [field]
