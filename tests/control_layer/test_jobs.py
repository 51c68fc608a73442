"""The job service functions end to end on a database fleet: quote, submit, place, cancel, read."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import pytest
from sqlalchemy import event, select, update

from contracts.errors import CpnError, FailedPrecondition, InvalidArgument, NoFeasiblePlan, NotFound
from contracts.roles import Principal, Role
from contracts.states import JobState
from contracts.worker_config import parse_worker_config
from control_layer.jobs import cancel_job, create_quote, get_job, job_tasks, list_jobs, submit_job
from control_layer.lifecycle import PLACER_CHANNEL
from control_layer.placer import place_pending
from control_layer.submissions import JobDraft, draft_job, store_jobs
from orchestration.context import ServerContext
from orchestration.db.engine import is_sqlite, session_scope
from orchestration.db.models import Allocation, Event, Job, Node, Quote, Tenant
from tests.orchestration.fleet import add_cluster, add_link, add_tenant, submit_and_place, tiny_spec


def _fleet(ctx: ServerContext) -> tuple[str, str, list[str]]:
    with session_scope(ctx.session_factory) as s:
        alice, bob = add_tenant(s, "alice"), add_tenant(s, "bob")
        _, nodes = add_cluster(s, region="eu-west", name="c1", nodes=3, devices_per_node=1, price=1.0)
        add_cluster(s, region="us-east", name="c2", nodes=1, devices_per_node=2, price=2.0)
        add_link(s, "eu-west", "us-east")
        return alice.id, bob.id, [n.id for n in nodes]


def _active_allocations(ctx: ServerContext, job_id: str) -> int:
    with session_scope(ctx.session_factory) as s:
        return len(
            s.scalars(
                select(Allocation).where(Allocation.job_id == job_id, Allocation.active.is_(True))
            ).all()
        )


def test_submit_only_stores_the_job_and_wakes_the_placer(ctx: ServerContext) -> None:
    alice, _, _ = _fleet(ctx)

    async def main() -> tuple[Job, tuple[str, dict]]:
        async with ctx.bus.subscribe(PLACER_CHANNEL, "node.*") as sub:
            job = await asyncio.to_thread(submit_job, ctx, alice, spec=tiny_spec())
            return job, await asyncio.wait_for(sub.__anext__(), 5)

    job, (channel, message) = asyncio.run(main())
    assert (channel, message["job_id"]) == (PLACER_CHANNEL, job.id)  # no assignment went out
    assert (job.status, job.attempt, job.option, job.estimated_cost) == (JobState.QUEUED, 0, None, None)
    with session_scope(ctx.session_factory) as s:
        assert job_tasks(s, job.id) == []
    assert _active_allocations(ctx, job.id) == 0


def test_placer_places_and_dispatches_to_each_node(ctx: ServerContext) -> None:
    alice, _, _ = _fleet(ctx)
    spec = tiny_spec(parallelism={"dp": 2}, qos={"regions": ["eu-west"]})
    job = submit_job(ctx, alice, spec=spec)

    async def main() -> list[tuple[str, dict]]:
        async with ctx.bus.subscribe("node.*") as sub:
            assert await asyncio.to_thread(place_pending, ctx) == [job.id]
            return [await asyncio.wait_for(sub.__anext__(), 5) for _ in range(2)]

    messages = asyncio.run(main())
    with session_scope(ctx.session_factory) as s:
        job = get_job(s, alice, job.id)
    assert (job.status, job.attempt, job.reason, job.deferred) == (JobState.PLACED, 1, "", None)
    assert job.option is not None and job.estimated_cost == job.option["estimates"]["cost"]["total"]
    with session_scope(ctx.session_factory) as s:
        tasks = job_tasks(s, job.id)
        kinds = s.scalars(select(Event.kind).where(Event.job_id == job.id).order_by(Event.id)).all()
    assert kinds == ["job.submitted", "job.placed"]
    assert len(tasks) == 2 and {t.status for t in tasks} == {"dispatched"}
    assert {t.region for t in tasks} == {"eu-west"}
    by_node = {channel.removeprefix("node."): m["assignment"] for channel, m in messages}
    assert set(by_node) == {t.node_id for t in tasks}
    for t in tasks:
        a = by_node[t.node_id]
        assert (a["assignment_id"], a["job_id"], a["attempt"], a["nproc"]) == (t.id, job.id, 1, 1)
        assert a["device_indices"] == t.device_indices == [0]
        cfg = parse_worker_config(json.loads(a["worker_config_json"]))
        assert cfg.global_replicas == 2 and cfg.parallel.dp_local == 1
        assert len(cfg.sync.peers) == 1 and cfg.sync.listen == f"127.0.0.1:{t.sync_port}"
    assert _active_allocations(ctx, job.id) == 2


def test_quote_then_accept_an_option(ctx: ServerContext) -> None:
    alice, bob, _ = _fleet(ctx)
    quote = create_quote(ctx, alice, tiny_spec())
    assert quote.options and quote.expires_at is not None
    chosen = quote.options[-1]
    with pytest.raises(NotFound):
        submit_job(ctx, bob, quote_id=quote.id, option_id=chosen["id"])  # not bob's quote
    with pytest.raises(NotFound, match="no option"):
        submit_job(ctx, alice, quote_id=quote.id, option_id="nope")
    job = submit_and_place(ctx, alice, quote_id=quote.id, option_id=chosen["id"])
    assert job.status == JobState.PLACED and job.quote_id == quote.id
    assert job.option is not None and job.option["id"] == chosen["id"]
    assert {(t["node"], t["device"]) for t in job.option["tasks"]} == {
        (t["node"], t["device"]) for t in chosen["tasks"]
    }


def test_expired_quote_is_refused(ctx: ServerContext) -> None:
    alice, _, _ = _fleet(ctx)
    quote = create_quote(ctx, alice, tiny_spec())
    with session_scope(ctx.session_factory) as s:
        s.execute(
            update(Quote).where(Quote.id == quote.id).values(expires_at=quote.expires_at - timedelta(hours=1))
        )
    with pytest.raises(FailedPrecondition, match="expired"):
        submit_job(ctx, alice, quote_id=quote.id)


def test_bad_requests_name_the_field(ctx: ServerContext) -> None:
    alice, _, _ = _fleet(ctx)
    with pytest.raises(InvalidArgument) as info:
        submit_job(ctx, alice, spec=tiny_spec(), choice="random")
    assert info.value.details["field"] == "choice"
    with pytest.raises(InvalidArgument):
        submit_job(ctx, alice)  # neither spec nor quote
    with pytest.raises(NotFound) as nf:
        submit_job(ctx, "no-such-tenant", spec=tiny_spec())
    assert nf.value.details["field"] == "tenant_id"
    # a spec that can never fit is accepted, then failed by the placer with the planner's reason
    job = submit_job(ctx, alice, spec=tiny_spec(qos={"regions": ["mars"]}))
    assert job.status == JobState.QUEUED and job.queue_position == 1
    place_pending(ctx)
    with session_scope(ctx.session_factory) as s:
        failed = get_job(s, alice, job.id)
        assert failed.status == JobState.FAILED and "no feasible placement" in failed.reason
        assert "even with every device free" in failed.reason


def test_cancel_stops_tasks_and_frees_devices(ctx: ServerContext) -> None:
    alice, bob, _ = _fleet(ctx)
    job = submit_and_place(ctx, alice, spec=tiny_spec(parallelism={"dp": 2}, qos={"regions": ["eu-west"]}))
    with pytest.raises(NotFound):
        cancel_job(ctx, job.id, "not yours", tenant_id=bob)

    async def main() -> list[tuple[str, dict]]:
        async with ctx.bus.subscribe("node.*") as sub:
            await asyncio.to_thread(cancel_job, ctx, job.id, "changed my mind", tenant_id=alice)
            return [await asyncio.wait_for(sub.__anext__(), 5) for _ in range(2)]

    cancels = asyncio.run(main())
    with session_scope(ctx.session_factory) as s:
        tasks = job_tasks(s, job.id)
        stored = s.get(Job, job.id)
        assert stored is not None and (stored.status, stored.reason) == ("cancelled", "changed my mind")
    assert {m["cancel"]["assignment_id"] for _, m in cancels} == {t.id for t in tasks}
    assert {t.status for t in tasks} == {"cancelled"}
    assert _active_allocations(ctx, job.id) == 0
    with pytest.raises(FailedPrecondition, match="already cancelled"):
        cancel_job(ctx, job.id, "again")


def test_tenants_see_only_their_jobs(ctx: ServerContext) -> None:
    alice, bob, _ = _fleet(ctx)
    job = submit_job(ctx, alice, spec=tiny_spec())
    with session_scope(ctx.session_factory) as s:
        root = add_tenant(s, "root", is_admin=True)
        admin = Principal(id=root.id, name=root.name, key_id="k", role=Role.ADMIN, platform=True)
        assert get_job(s, alice, job.id).id == job.id
        with pytest.raises(NotFound):
            get_job(s, bob, job.id)
        assert [j.id for j in list_jobs(s, alice)] == [job.id]
        assert list_jobs(s, s.get(Tenant, bob)) == []  # type: ignore[arg-type]
        assert [j.id for j in list_jobs(s, admin)] == [job.id]
        assert list_jobs(s, alice, status="failed") == []
        with pytest.raises(InvalidArgument):
            list_jobs(s, alice, status="weird")


def test_deferral_is_its_own_column_and_placement_clears_it(ctx: ServerContext) -> None:
    from control_layer.jobs import _defer

    alice, _, _ = _fleet(ctx)
    job = submit_job(ctx, alice, spec=tiny_spec())
    _defer(ctx, job.id, "devices contended: 5 placements collided; last: devices already allocated")
    with session_scope(ctx.session_factory) as s:
        waiting = get_job(s, alice, job.id)
        assert (waiting.status, waiting.reason) == (JobState.QUEUED, "")
        assert waiting.deferred is not None and waiting.deferred.startswith("devices contended")
        kinds = s.scalars(select(Event.kind).where(Event.job_id == job.id)).all()
    assert kinds[-1] == "job.deferred"
    assert place_pending(ctx) == [job.id]
    with session_scope(ctx.session_factory) as s:
        placed = get_job(s, alice, job.id)
        assert (placed.status, placed.reason, placed.deferred) == (JobState.PLACED, "", None)


def test_a_batch_of_submissions_is_one_transaction_of_four_statements(ctx: ServerContext) -> None:
    """A submission's statements sit on the request path of ``POST /v1/jobs``, and concurrent
    submissions share them (``control_layer.submissions``): the tenants' spend caps and the queue's
    length by priority are read, the jobs and their events inserted, one statement each, however
    many jobs the batch holds."""
    alice, _, _ = _fleet(ctx)
    engine = ctx.session_factory.kw["bind"]

    def statements_of(drafts: list[JobDraft]) -> tuple[list[str], list[JobDraft | CpnError]]:
        seen_statements: list[str] = []

        def seen(_conn: object, _cursor: object, statement: str, *_: object) -> None:
            words = statement.replace('"', "").split()
            if words[0] in ("SELECT", "INSERT", "UPDATE", "DELETE"):  # not BEGIN (SQLite's write lock)
                table = words[words.index("FROM") + 1] if words[0] == "SELECT" else words[2]
                seen_statements.append(f"{words[0]} {table}")

        event.listen(engine, "before_cursor_execute", seen)
        try:
            return seen_statements, store_jobs(ctx, drafts)
        finally:
            event.remove(engine, "before_cursor_execute", seen)

    four = ["SELECT tenants", "SELECT jobs", "INSERT jobs", "INSERT events"]
    one, (job,) = statements_of([draft_job(ctx, alice, spec=tiny_spec())])
    assert one == four
    assert isinstance(job, JobDraft) and job.queue_position == 1
    many, jobs = statements_of([draft_job(ctx, alice, spec=tiny_spec(f"j{i}")) for i in range(50)])
    if is_sqlite(engine):  # SQLite's RETURNING does not promise the rows' order: events one by one
        assert many == four[:3] + ["INSERT events"] * 50
    else:
        assert many == four
    assert [j.queue_position for j in jobs if isinstance(j, JobDraft)] == list(range(2, 52))
    with session_scope(ctx.session_factory) as s:
        assert s.get(Job, job.id) is not None
        assert s.scalar(select(Event.kind).where(Event.job_id == job.id)) == "job.submitted"
    with pytest.raises(NotFound):
        submit_job(ctx, "no-such-tenant", spec=tiny_spec())


def test_a_job_only_a_measuring_node_could_run_waits_for_it_and_runs_once_it_is_ready(
    ctx: ServerContext,
) -> None:
    """A node registered before its profile is not in the fleet yet: a quote that finds no plan
    says it is measuring, a job that fits nowhere else waits for it rather than failing, and is
    placed there once the profile lands; with no node measuring, such a job fails."""
    with session_scope(ctx.session_factory) as s:
        alice = add_tenant(s, "alice").id
        _, (node,) = add_cluster(s, region="eu-west", name="c1", nodes=1, devices_per_node=2, price=1.0)
        s.execute(update(Node).where(Node.id == node.id).values(measuring=True))
        node_id = node.id
    with pytest.raises(NoFeasiblePlan) as refused:
        create_quote(ctx, alice, tiny_spec())
    assert "1 node(s) are still measuring their profile" in refused.value.message
    assert refused.value.details["measuring_nodes"] == 1
    job = submit_job(ctx, alice, spec=tiny_spec())
    place_pending(ctx)
    with session_scope(ctx.session_factory) as s:
        waiting = get_job(s, alice, job.id)
        assert waiting.status == JobState.QUEUED
        assert "waiting for 1 node(s) measuring their profile" in (waiting.deferred or "")

    with session_scope(ctx.session_factory) as s:
        s.execute(update(Node).where(Node.id == node_id).values(measuring=False))
    place_pending(ctx)
    with session_scope(ctx.session_factory) as s:
        placed = get_job(s, alice, job.id)
        assert placed.status != JobState.QUEUED and {t.node_id for t in job_tasks(s, job.id)} == {node_id}
    never = submit_job(ctx, alice, spec=tiny_spec(qos={"regions": ["mars"]}))
    place_pending(ctx)
    with session_scope(ctx.session_factory) as s:
        assert get_job(s, alice, never.id).status == JobState.FAILED  # nothing measuring: it fails
