"""Quote → job → running → succeeded over the real REST and gRPC servers, with events and metrics."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from control_layer.reactions import on_task_metrics, on_task_status
from service_layer.client import ApiError, CpnClient
from service_layer.server import ServerHandle
from tests.service_layer.harness import count_rows, new_tenant, seed_fleet, small_spec, wait_placed

# What a worker on small_spec's data reports as its Markov source's entropy rate (nats/token).
FLOOR = 1.234


def _expect_error(status: int, call: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        call()
    assert info.value.status == status, info.value
    return info.value


def test_invalid_spec_is_422_naming_the_field_and_stores_nothing(
    server: ServerHandle, admin: CpnClient
) -> None:
    seed_fleet(server, admin)
    before = count_rows(server)
    bad_steps = small_spec()
    bad_steps["training"]["steps"] = 0
    err = _expect_error(422, lambda: admin.quote(bad_steps))
    assert err.code == "invalid_argument"
    assert [e["field"] for e in err.details["errors"]] == ["training.steps"]
    assert "training.steps" in err.message

    unknown = small_spec()
    unknown["qos"]["bogus"] = 1
    err = _expect_error(422, lambda: admin.quote(unknown))
    assert [e["field"] for e in err.details["errors"]] == ["qos.bogus"]

    pinned = small_spec()
    pinned["parallelism"] = {"dp": 0}
    err = _expect_error(422, lambda: admin.quote(pinned))
    assert "parallelism.dp" in [e["field"] for e in err.details["errors"]]  # union member names left out

    err = _expect_error(422, lambda: admin.submit(spec=bad_steps, choice="fastest"))
    assert [e["field"] for e in err.details["errors"]] == ["spec.training.steps"]
    err = _expect_error(422, lambda: admin.submit(spec=small_spec(), choice="priciest"))
    assert [e["field"] for e in err.details["errors"]] == ["choice"]
    r = admin._http.post("/v1/jobs", json={"quote_id": "abc"})
    assert r.status_code == 422 and "option_id" in r.json()["message"]
    assert count_rows(server) == before


def test_no_feasible_plan_is_409_with_the_explanation(server: ServerHandle, admin: CpnClient) -> None:
    seed_fleet(server, admin)
    err = _expect_error(409, lambda: admin.quote(small_spec(regions=["mars-1"])))
    assert err.code == "no_feasible_plan"
    assert err.details.get("explanation"), err.details


def _collect_events(
    client: CpnClient, job_id: str, out: list[dict[str, Any]], ready: threading.Event
) -> None:
    for ev in client.events(job_id, follow=True):
        out.append(ev)
        ready.set()


def test_quote_then_job_through_to_success(server: ServerHandle, admin: CpnClient) -> None:
    nodes = seed_fleet(server, admin)
    _, alice = new_tenant(admin, server, "alice")
    with alice:
        regions = {r["name"]: r for r in alice.regions()}
        assert set(regions) == {"eu-west", "eu-north"} and regions["eu-west"]["alive_nodes"] == 1
        clusters = {c["name"]: c for c in alice.clusters()}
        assert clusters["stockholm-1"]["price_per_device_hour"] == 0.9
        node = clusters["paris-1"]["nodes"][0]
        assert node["alive"] is True and node["status"] == "alive" and len(node["devices"]) == 2

        quote = alice.quote(small_spec())
        assert quote["options"], quote
        option = quote["options"][0]
        assert option["estimates"]["duration_s"] > 0 and option["estimates"]["cost"]["total"] > 0
        # the quote shows the runtime settings its workers will get
        runtime = option["runtime"]
        assert 1 <= runtime["checkpoint_every"] <= small_spec()["training"]["steps"]
        assert (
            runtime["checkpoint_fraction"] <= 0.02
            or runtime["checkpoint_every"] == small_spec()["training"]["steps"]
        )

        submitted = alice.submit(quote_id=quote["id"], option_id=option["id"])
        # Submission stores the job and wakes the placer; by the time the answer is read back the
        # placer may already have placed it (test_jobs checks submission alone never places).
        assert submitted["status"] in ("queued", "placed"), submitted
        job = wait_placed(alice, submitted["id"])
        assert job["status"] == "placed", job
        assert job["option"]["id"] == option["id"]
        assert job["estimates"]["cost_total"] == pytest.approx(option["estimates"]["cost"]["total"])
        assert job["tasks"] and {t["cluster_name"] for t in job["tasks"]} <= {"paris-1", "stockholm-1"}
        assert job["entropy_floor"] is None  # workers report it; nothing has run yet
        job_id = job["id"]

        events: list[dict[str, Any]] = []
        first = threading.Event()
        reader = threading.Thread(target=_collect_events, args=(alice, job_id, events, first), daemon=True)
        reader.start()
        assert first.wait(10), "the event stream sent no history"

        node_of = {n.node_id for n in nodes.values()}
        for t in job["tasks"]:
            assert t["node_id"] in node_of
            on_task_status(server.ctx, t["node_id"], t["id"], "running")
        for step in (1, 2, 3):
            for t in job["tasks"]:
                on_task_metrics(
                    server.ctx,
                    t["node_id"],
                    t["id"],
                    {
                        "step": step,
                        "total_steps": 40,
                        "loss": 4.0 - step * 0.5,
                        "tokens_per_s": 1000.0,
                        "entropy_floor": FLOOR,
                        "wan_bytes_sent": 1000 * step,
                        # Kernel wire counts: the workers read them from step 3 on.
                        **({"wan_wire_bytes_sent": 1100 * step} if step == 3 else {}),
                    },
                )
            if step == 2:  # the wire count is unavailable (null), not 0, until every task has one
                progress = alice.job(job_id)["progress"]
                assert progress["wan_wire_bytes_sent"] is None and progress["wan_bytes_sent"] > 0
        running = alice.job(job_id)
        assert running["status"] == "running"
        assert running["progress"]["wan_bytes_sent"] == 3000 * len(job["tasks"])
        assert running["progress"]["wan_wire_bytes_sent"] == 3300 * len(job["tasks"])
        assert running["progress"]["step"] == 3 and running["progress"]["loss"] == pytest.approx(2.5)
        assert running["progress"]["tokens_per_s"] == pytest.approx(1000.0 * len(job["tasks"]))
        curve = alice.metrics(job_id)
        assert sum(len(pts) for pts in curve["series"].values()) == 3 * len(job["tasks"])
        assert running["entropy_floor"] == curve["entropy_floor"] == pytest.approx(FLOOR)  # as reported

        for t in job["tasks"]:
            on_task_status(
                server.ctx,
                t["node_id"],
                t["id"],
                "succeeded",
                exit_code=0,
                result={"loss_start": 4.1, "loss_end": 2.5, "steps": 40},
            )
        reader.join(15)
        assert not reader.is_alive(), "the event stream did not end with the job"
        done = alice.job(job_id)
        assert done["status"] == "succeeded" and done["actual_duration_s"] is not None

    kinds = [e["data"].get("kind") for e in events if e["event"] == "message"]
    for kind in ("job.submitted", "job.placed", "job.running", "job.succeeded"):
        assert kind in kinds, kinds
    assert kinds.count("task.metrics") == 3 * len(job["tasks"])  # live, not persisted: passed through
    assert events[-1] == {"event": "end", "id": None, "data": {"status": "succeeded"}}
    ids = [int(e["id"]) for e in events if e["id"] is not None]
    assert ids == sorted(set(ids))  # history and live overlap de-duplicated, in order

    # resuming after the last id replays nothing but the end
    replay = list(admin.events(job_id, after=ids[-1], follow=True))
    assert replay == [{"event": "end", "id": None, "data": {"status": "succeeded"}}]


def test_spec_and_choice_then_cancel(server: ServerHandle, admin: CpnClient) -> None:
    seed_fleet(server, admin)
    job = wait_placed(admin, admin.submit(spec=small_spec("by-choice"), choice="fastest")["id"])
    assert job["status"] == "placed" and job["choice"] == "fastest"
    listed = admin.jobs(status="placed")
    assert [j["id"] for j in listed] == [job["id"]]
    cancelled = admin.cancel(job["id"], "changed my mind")
    assert cancelled["status"] == "cancelled" and cancelled["reason"] == "changed my mind"
    assert all(t["status"] == "cancelled" for t in cancelled["tasks"])
    err = _expect_error(409, lambda: admin.cancel(job["id"]))
    assert err.code == "failed_precondition"
    # its devices are free again: the snapshot offers all four
    snap = admin.snapshot()
    assert sum(d["free"] for c in snap["clusters"] for n in c["nodes"] for d in n["devices"]) == 4
