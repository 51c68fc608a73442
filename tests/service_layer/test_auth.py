"""API keys: 401 without or with a bad key, 403 for non-admins on admin endpoints, tenant isolation."""

from __future__ import annotations

import time

import httpx
import pytest
from sqlalchemy import select

from orchestration.db.engine import session_scope
from orchestration.db.models import ApiKey, Job, Tenant
from service_layer.auth import revoke_api_key
from service_layer.client import ApiError, CpnClient
from service_layer.key_cache import KeyCache
from service_layer.server import ServerHandle
from tests.service_layer.harness import new_tenant, small_spec


def _insert_job(server: ServerHandle, tenant_id: str) -> str:
    with session_scope(server.ctx.session_factory) as session:
        job = Job(tenant_id=tenant_id, name="private", spec=small_spec("private"))
        session.add(job)
        session.flush()
        return job.id


def test_keys_are_required_valid_and_scoped(server: ServerHandle, admin: CpnClient) -> None:
    with httpx.Client(base_url=server.http_url, timeout=10) as raw:
        r = raw.get("/v1/jobs")
        assert r.status_code == 401
        assert r.headers["www-authenticate"] == "Bearer"
        assert r.json()["code"] == "unauthenticated"
        assert (
            raw.get("/v1/jobs", headers={"Authorization": "Bearer cpn_not-a-real-key-at-all"}).status_code
            == 401
        )
        assert raw.get("/v1/jobs", headers={"Authorization": "Basic abc"}).status_code == 401
        assert raw.get("/dashboard").status_code == 200  # development + loopback: open without a key
        health = raw.get("/healthz")
        assert health.status_code == 200, health.text
        assert health.json() == {
            "status": "ok",
            "database": "ok",
            "bus": "ok",
            "replica": server.ctx.settings.replica_id,
        }

    tenant, alice = new_tenant(admin, server, "alice")
    with alice:
        assert alice.jobs() == []
        for call in (lambda: alice.create_token("acme"), lambda: alice.create_tenant("eve"), alice.snapshot):
            with pytest.raises(ApiError) as denied:
                call()
            assert denied.value.status == 403 and denied.value.code == "permission_denied"

    # keys are stored hashed: the plaintext appears nowhere in the table
    key = admin.create_key(tenant["id"])["key"]
    with server.ctx.session_factory() as session:
        rows = list(session.scalars(select(ApiKey).where(ApiKey.tenant_id == tenant["id"])))
    assert len(rows) == 2
    assert all(key not in (r.key_hash, r.prefix) and len(r.key_hash) == 64 for r in rows)
    assert any(key.startswith(r.prefix) for r in rows)


def test_a_tenant_sees_only_its_own_jobs(server: ServerHandle, admin: CpnClient) -> None:
    a, alice = new_tenant(admin, server, "alice")
    _, bob = new_tenant(admin, server, "bob")
    job_id = _insert_job(server, a["id"])
    with alice, bob:
        assert alice.job(job_id)["name"] == "private"
        assert [j["id"] for j in alice.jobs()] == [job_id]
        assert bob.jobs() == []
        for path in (
            f"/v1/jobs/{job_id}",
            f"/v1/jobs/{job_id}/metrics",
            f"/v1/jobs/{job_id}/events?follow=false",
        ):
            r = bob._http.get(path)
            assert r.status_code == 404, (path, r.text)
            assert r.json()["code"] == "not_found"
        r = bob._http.post(f"/v1/jobs/{job_id}/cancel", json={"reason": "not mine"})
        assert r.status_code == 404
        assert alice.job(job_id)["status"] == "queued"  # bob's cancel changed nothing
    assert job_id in [j["id"] for j in admin.jobs()]
    assert admin.job(job_id)["tenant_id"] == a["id"]


def test_a_verified_key_is_held_briefly_and_a_revoked_one_stops_at_once(
    server: ServerHandle, admin: CpnClient
) -> None:
    tenant, alice = new_tenant(admin, server, "alice")
    with alice:
        assert alice.jobs() == []  # verified: now held by the key cache
        with session_scope(server.ctx.session_factory) as session:
            (row,) = session.scalars(select(ApiKey).where(ApiKey.tenant_id == tenant["id"]))
            revoke_api_key(session, row.id)
        with pytest.raises(ApiError) as refused:
            alice.jobs()
        assert refused.value.status == 401


def test_the_key_cache_ages_out_and_stays_bounded() -> None:
    cache = KeyCache(ttl_s=0.05, max_entries=2)
    held = Tenant(id="t1", name="t1")
    cache.put("d1", held)
    assert cache.get("d1") is held and cache.get("d2") is None
    time.sleep(0.1)
    assert cache.get("d1") is None  # aged out: looked up again
    for digest in ("a", "b", "c"):
        cache.put(digest, held)
    assert sum(cache.get(d) is not None for d in "abc") <= 2
