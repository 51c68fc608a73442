"""Event streams share one bus subscription per process, and each tenant has a cap on open streams."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
import redis
from sqlalchemy import select

from contracts.states import JobState
from orchestration.db.engine import session_scope
from orchestration.db.models import Job, Tenant
from orchestration.events import record_event
from service_layer.server import start_server_in_thread
from tests.conftest import REDIS_URL, settings_for
from tests.service_layer.harness import ADMIN_KEY, small_spec

STREAMS = 40


def _job(server, tenant_id: str) -> str:  # noqa: ANN001
    with session_scope(server.ctx.session_factory) as session:
        # running, so the placer leaves it alone and its stream stays open
        job = Job(tenant_id=tenant_id, name="watched", spec=small_spec("watched"), status=JobState.RUNNING)
        session.add(job)
        session.flush()
        return job.id


def _admin_id(server) -> str:  # noqa: ANN001
    with session_scope(server.ctx.session_factory) as session:
        return session.scalars(select(Tenant.id).where(Tenant.is_admin)).one()


async def _open_streams(url: str, job_id: str, n: int, first_event: asyncio.Event) -> list[str]:
    """Open n streams; return what each one's first live 'data:' line said."""
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as client:
        opened = 0
        ready = asyncio.Event()

        async def one() -> str:
            nonlocal opened
            async with client.stream("GET", f"/v1/jobs/{job_id}/events") as r:
                assert r.status_code == 200
                opened += 1
                if opened == n:
                    ready.set()
                async for line in r.aiter_lines():
                    if line.startswith("data:"):
                        return line
            return ""

        tasks = [asyncio.create_task(one()) for _ in range(n)]
        await asyncio.wait_for(ready.wait(), 30)
        first_event.set()
        return await asyncio.wait_for(asyncio.gather(*tasks), 30)


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_many_streams_share_one_redis_subscription(db_url: str, tmp_path: Path) -> None:
    settings = settings_for(
        db_url,
        data_dir=tmp_path,
        http_port=0,
        grpc_port=0,
        admin_api_key=ADMIN_KEY,
        max_streams_per_tenant=100,
    )
    server = start_server_in_thread(settings)
    probe = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    name = server.ctx.bus.client_name  # this server's connections, not other tests'

    def connections() -> int:
        return sum(c["name"] == name for c in probe.client_list())

    try:
        job_id = _job(server, _admin_id(server))
        before = connections()
        opened = asyncio.Event()
        counted: list[int] = []

        async def run() -> list[str]:
            streams = asyncio.create_task(_open_streams(server.http_url, job_id, STREAMS, opened))
            await opened.wait()
            counted.append(connections())
            with session_scope(server.ctx.session_factory) as session:
                record_event(session, server.ctx.bus, "job.note", job_id, {"n": 1})
            return await streams

        lines = asyncio.run(run())
        assert all('"kind":"job.note"' in line for line in lines), lines[:3]
        # one shared subscription (+ the pool's connections), not one per stream
        assert counted[0] - before <= 3, (before, counted)
    finally:
        probe.close()
        server.stop()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_tenant_past_its_stream_cap_gets_429(db_url: str, tmp_path: Path) -> None:
    settings = settings_for(
        db_url, data_dir=tmp_path, http_port=0, grpc_port=0, admin_api_key=ADMIN_KEY, max_streams_per_tenant=3
    )
    server = start_server_in_thread(settings)
    try:
        job_id = _job(server, _admin_id(server))
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}

        async def run() -> tuple[int, dict]:
            async with httpx.AsyncClient(base_url=server.http_url, headers=headers, timeout=30) as client:
                streams = [client.stream("GET", f"/v1/jobs/{job_id}/events") for _ in range(3)]
                held = [await s.__aenter__() for s in streams]
                assert all(r.status_code == 200 for r in held)
                over = await client.get(f"/v1/jobs/{job_id}/events")
                for s in streams:
                    await s.__aexit__(None, None, None)
                return over.status_code, over.json()

        status, body = asyncio.run(run())
        assert status == 429 and body["code"] == "resource_exhausted" and "at most 3" in body["message"]
    finally:
        server.stop()
