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
