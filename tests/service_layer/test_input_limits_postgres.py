"""Out-of-bounds numbers on PostgreSQL, where a stored non-finite float or an overflowing timestamp
or integer fails at commit: each must be a 422 naming the field, and nothing is stored."""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import func, select

from orchestration.db.models import EnrollmentToken, Job
from service_layer.server import ServerHandle
from tests.service_layer.harness import ADMIN_KEY

pytestmark = pytest.mark.parametrize(
    "db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)

HEADERS = {"Authorization": f"Bearer {ADMIN_KEY}", "content-type": "application/json"}


def _count(server: ServerHandle, model: type) -> int:
    with server.ctx.session_factory() as session:
        return int(session.scalar(select(func.count()).select_from(model)) or 0)


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ('"qos": {"max_cost": Infinity}', "qos.max_cost"),
        ('"training": {"steps": 2, "global_batch_tokens": 8, "lr": 1e308}', "training.lr"),
        ('"data": {"seed": 1180591620717411303424}', "data.seed"),
        ('"sync": {"every": 1000000000000000000}', "sync.every"),
    ],
)
def test_a_submitted_spec_out_of_bounds_is_a_422_and_stores_nothing(
    server: ServerHandle, patch: str, field: str
) -> None:
    fields = {
        "name": '"b"',
        "model": '{"n_layers": 1, "d_model": 8, "n_heads": 2, "vocab": 16, "seq_len": 4}',
        "training": '{"steps": 2, "global_batch_tokens": 8}',
    }
    name, value = patch.split(": ", 1)
    fields[name.strip('"')] = value
    spec = "{" + ", ".join(f'"{k}": {v}' for k, v in fields.items()) + "}"
    r = httpx.post(
        server.http_url + "/v1/jobs", content='{"spec": ' + spec + "}", headers=HEADERS, timeout=30
    )
    assert r.status_code == 422, r.text
    assert [e["field"] for e in r.json()["details"]["errors"]] == [f"spec.{field}"]
    assert _count(server, Job) == 0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ('{"provider": "acme", "ttl_s": 1e300}', "ttl_s"),
        ('{"provider": "acme", "ttl_s": Infinity}', "ttl_s"),
        ('{"provider": "acme", "max_uses": 2147483648}', "max_uses"),
    ],
)
def test_a_token_out_of_bounds_is_a_422_and_stores_nothing(
    server: ServerHandle, body: str, field: str
) -> None:
    r = httpx.post(server.http_url + "/v1/tokens", content=body, headers=HEADERS, timeout=30)
    assert r.status_code == 422, r.text
    assert [e["field"] for e in r.json()["details"]["errors"]] == [field]
    assert _count(server, EnrollmentToken) == 0


@pytest.mark.parametrize("path", ["/v1/audit", "/v1/ledger/transactions", "/v1/jobs/x/events?follow=false&"])
@pytest.mark.parametrize("after", [2**31, 274877906944, 4611686018427387904, 2**63])
def test_a_cursor_past_the_id_column_is_a_422(server: ServerHandle, path: str, after: int) -> None:
    sep = "" if path.endswith("&") else "?"
    r = httpx.get(f"{server.http_url}{path}{sep}after={after}", headers=HEADERS, timeout=30)
    assert r.status_code == 422, r.text
    assert [e["field"] for e in r.json()["details"]["errors"]] == ["query.after"]


def test_the_largest_cursor_the_column_holds_is_answered(server: ServerHandle) -> None:
    for path in ("/v1/audit", "/v1/ledger/transactions"):
        r = httpx.get(f"{server.http_url}{path}?after={2**31 - 1}", headers=HEADERS, timeout=30)
        assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ('{"quote_id": "q\\u0000", "option_id": "opt-1"}', "quote_id"),
        ('{"quote_id": "q", "option_id": "\\u0000"}', "option_id"),
        ('{"spec": {"name": "a", "qos": {"regions": ["eu\\u0000"]}}}', "spec.qos.regions.0"),
    ],
)
def test_nul_in_a_body_is_a_422_naming_the_field_and_stores_nothing(
    server: ServerHandle, body: str, field: str
) -> None:
    r = httpx.post(server.http_url + "/v1/jobs", content=body, headers=HEADERS, timeout=30)
    assert r.status_code == 422, r.text
    assert [e["field"] for e in r.json()["details"]["errors"]] == [field]
    assert _count(server, Job) == 0


def test_nul_in_a_query_is_a_422_and_an_escaped_backslash_is_not_nul(server: ServerHandle) -> None:
    r = httpx.get(server.http_url + "/v1/audit?action=a%00b", headers=HEADERS, timeout=30)
    assert r.status_code == 422, r.text
    assert r.json()["details"]["errors"][0]["field"] == "query.action"
    # "\\u0000" in JSON is a backslash and the text u0000: an ordinary (if invalid) quote id
    r = httpx.post(
        server.http_url + "/v1/jobs",
        content='{"quote_id": "q\\\\u0000", "option_id": "o"}',
        headers=HEADERS,
        timeout=30,
    )
    assert r.status_code == 404, r.text
