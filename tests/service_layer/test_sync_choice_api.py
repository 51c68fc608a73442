"""Sync settings left to the planner, over REST: the quote shows what it chose, the job keeps it,
the workers' configs carry it; bad values are 422 naming the field and store nothing."""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import select

from contracts.worker_config import parse_worker_config
from control_layer.planner.sync_choice import every_candidates
from orchestration.db.models import Task
from service_layer.client import ApiError, CpnClient
from service_layer.server import ServerHandle
from tests.service_layer.harness import count_rows, seed_fleet, small_spec, wait_placed

STEPS = 200


def _auto_spec() -> dict:
    spec = small_spec(steps=STEPS)
    spec["sync"] = {"mode": "diloco"}  # H and the codec are the planner's
    spec["parallelism"] = {"dp": 4}  # a replica on every device of both regions' nodes
    return spec


def test_the_quote_shows_the_chosen_sync_settings_and_the_workers_get_them(
    server: ServerHandle, admin: CpnClient
) -> None:
    seed_fleet(server, admin)
    quote = admin.quote(_auto_spec())
    assert quote["spec"]["sync"]["every"] == "auto" and quote["spec"]["sync"]["compression"] == "auto"
    for o in quote["options"]:
        rt = o["runtime"]
        assert rt["sync_every"] == o["sync"]["every"] and rt["sync_every"] in every_candidates(STEPS)
        assert rt["sync_compression"] == o["sync"]["compression"] == "int8"
        assert f"H={rt['sync_every']}" in rt["sync_choice"] and "int8" in rt["sync_choice"]
    option = next(o for o in quote["options"] if len(o["regions"]) == 2)
    h = option["sync"]["every"]

    job = wait_placed(admin, admin.submit(quote_id=quote["id"], option_id=option["id"])["id"])
    assert job["status"] == "placed", job
    # the job keeps the values its option chose, so a re-placement trains with the same ones
    assert job["spec"]["sync"]["every"] == h and job["spec"]["sync"]["compression"] == "int8"
    assert job["option"]["runtime"]["sync_every"] == h
    with server.ctx.session_factory() as s:
        configs = [t.worker_config for t in s.scalars(select(Task).where(Task.job_id == job["id"]))]
    assert len(configs) == 2
    for cfg in configs:
        sync = parse_worker_config(cfg).sync  # the worker's own schema accepts it
        assert sync.every == h and sync.compression == "int8" and sync.mode == "diloco"
        assert sync.overlap and sync.every % sync.fragments == 0
    # the job's dashboard page marks them as the planner's (open from loopback in development)
    page = httpx.get(f"{server.http_url}/dashboard/jobs/{job['id']}", timeout=10)
    assert page.status_code == 200
    assert f"diloco every {h}* · int8*" in page.text and "chosen by the planner" in page.text


def test_explicit_values_are_quoted_as_given(server: ServerHandle, admin: CpnClient) -> None:
    seed_fleet(server, admin)
    spec = _auto_spec()
    spec["sync"] = {"mode": "diloco", "every": 25, "compression": "bf16"}
    for o in admin.quote(spec)["options"]:
        assert o["sync"]["every"] == 25 and o["sync"]["compression"] == "bf16"
        assert o["runtime"]["sync_every"] is None and o["runtime"]["sync_compression"] is None


@pytest.mark.parametrize(
    ("sync", "field"),
    [
        ({"every": 0}, "sync.every"),
        ({"every": "sometimes"}, "sync.every"),
        ({"every": 10_000_000}, "sync.every"),
        ({"compression": "gzip"}, "sync.compression"),
    ],
)
def test_bad_sync_values_are_422_naming_the_field(
    server: ServerHandle, admin: CpnClient, sync: dict, field: str
) -> None:
    seed_fleet(server, admin)
    before = count_rows(server)
    spec = _auto_spec()
    spec["sync"] |= sync
    for call, prefix in ((lambda: admin.quote(spec), ""), (lambda: admin.submit(spec=spec), "spec.")):
        with pytest.raises(ApiError) as info:
            call()
        assert info.value.status == 422, info.value
        assert [e["field"] for e in info.value.details["errors"]] == [prefix + field]
    assert count_rows(server) == before
