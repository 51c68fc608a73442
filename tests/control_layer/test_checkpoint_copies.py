"""Where a job's checkpoints have copies: the copy ordered when a task reports a newer checkpoint,
the receiver's report, what a re-placement may resume from once the task's node is gone, and the
signed fetch its worker config carries."""

from __future__ import annotations

import asyncio
import time

import pytest
from cryptography import x509
from sqlalchemy import select

from contracts.checkpoint_transfer import CheckpointTicket, checkpoint_server_name, verify
from contracts.errors import FailedPrecondition, NotFound
from control_layer.checkpoint_copies import reachable_checkpoints, record_copy_result, sign_fetches
from control_layer.reactions import on_task_metrics, on_task_status
from control_layer.worker_config import job_sync_secret
from orchestration.context import ServerContext
from orchestration.db.engine import session_scope
from orchestration.db.models import CheckpointCopy, Event, Node, Task
from orchestration.sync_tls import job_ca_pem
from resource_layer.liveness import node_alive_key
from tests.orchestration.fleet import add_cluster, add_tenant, submit_and_place, tiny_spec

SPEC = tiny_spec(parallelism={"dp": 2}, training={"steps": 40, "global_batch_tokens": 64})


def _setup(ctx: ServerContext) -> tuple[str, list[str]]:
    with session_scope(ctx.session_factory) as s:
        tenant = add_tenant(s)
        _, nodes = add_cluster(s, region="eu-west", name="c1", nodes=3, devices_per_node=1, price=2.0)
        for i, n in enumerate(nodes):  # every node serves checkpoints (the agents' checkpoint port)
            n.checkpoint_port, n.probe_key = 40000 + i, f"{i:064x}"
        tenant_id, node_ids = tenant.id, [n.id for n in nodes]
    for n in node_ids:
        ctx.bus.touch(node_alive_key(n), 600)
    job = submit_and_place(ctx, tenant_id, spec=SPEC)
    assert job.status == "placed"
    return job.id, node_ids


def _assert_job_credentials(tls: dict, job_id: str, server_secret: str) -> None:
    """A certificate of the job's CA (the one its sync trusts) naming the job's checkpoint server."""
    ca = x509.load_pem_x509_certificate(tls["ca_pem"].encode())
    cert = x509.load_pem_x509_certificate(tls["cert_pem"].encode())
    job_ca = x509.load_pem_x509_certificate(
        job_ca_pem(job_sync_secret(server_secret, job_id), job_id).encode()
    )
    assert (ca.subject, ca.public_key()) == (job_ca.subject, job_ca.public_key())  # ECDSA: signatures vary
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == [checkpoint_server_name(job_id)]
    assert "PRIVATE KEY" in tls["key_pem"]


def test_a_newer_checkpoint_is_copied_to_another_node_and_a_replacement_can_fetch_it(
    ctx: ServerContext,
) -> None:
    job_id, node_ids = _setup(ctx)
    with session_scope(ctx.session_factory) as s:
        a, b = s.scalars(select(Task).where(Task.job_id == job_id).order_by(Task.id)).all()
        a_id, a_node, b_node, a_key = a.id, a.node_id, b.node_id, a.worker_config["region"]
        # Each task's agent serves its checkpoints over TLS with the job's credentials.
        for t in (a, b):
            _assert_job_credentials(t.worker_config["checkpoint"]["tls"], job_id, ctx.settings.secret_key)
    idle = (set(node_ids) - {a_node, b_node}).pop()
    on_task_status(ctx, a_node, a_id, "running", "", None, None)
    on_task_metrics(ctx, a_node, a_id, {"step": 9, "loss": 3.0, "checkpoint_step": 0})

    async def reported() -> tuple[str, dict]:
        async with ctx.bus.subscribe("node.*") as sub:
            on_task_metrics(ctx, a_node, a_id, {"step": 11, "loss": 3.0, "checkpoint_step": 10})
            return await asyncio.wait_for(sub.__anext__(), 5)

    channel, message = asyncio.run(reported())
    order_sent = message["checkpoint_copy"]
    on_task_metrics(ctx, a_node, a_id, {"step": 12, "loss": 3.0, "checkpoint_step": 10})  # no new one
    with session_scope(ctx.session_factory) as s:
        (order,) = s.scalars(select(CheckpointCopy).where(CheckpointCopy.job_id == job_id)).all()
        assert (order.status, order.step, order.source_node_id, order.participant) == (
            "pending",
            10,
            a_node,
            a_key,
        )
        assert (
            order.node_id in {idle, b_node} and order.dir == f"checkpoints/{job_id}/{a_key.replace('/', '_')}"
        )
        transfer, target = order.id, order.node_id
    # The receiver fetches, and later serves, with the job's credentials; the source's TLS port.
    assert channel == f"node.{target}" and order_sent["source_port"] == 40000 + node_ids.index(a_node)
    _assert_job_credentials(order_sent["tls"], job_id, ctx.settings.secret_key)

    with session_scope(ctx.session_factory) as s, pytest.raises(NotFound):  # only the ordered node reports
        record_copy_result(ctx, s, a_node, {"transfer_id": transfer, "bytes": 5, "duration_s": 0.1})
    with session_scope(ctx.session_factory) as s:
        record_copy_result(ctx, s, target, {"transfer_id": transfer, "bytes": 12345, "duration_s": 0.5})
    with session_scope(ctx.session_factory) as s, pytest.raises(FailedPrecondition):
        record_copy_result(ctx, s, target, {"transfer_id": transfer, "bytes": 1, "duration_s": 0.1})
    with session_scope(ctx.session_factory) as s:
        (event,) = s.scalars(
            select(Event).where(Event.job_id == job_id, Event.kind == "job.checkpoint_copied")
        )
        assert event.payload["node_id"] == target and event.payload["bytes"] == 12345
        held = reachable_checkpoints(s, job_id)[a_key]
        assert held["step"] == 10 and held["node_id"] == a_node
        assert held["holders"] == sorted(
            [{"step": 10, "node_id": a_node}, {"step": 10, "node_id": target}],
            key=lambda h: (h["step"], h["node_id"]),
        )
        # The task's node dies: the copy is what is left, and a fetch from it is signed by its key.
        s.get(Node, a_node).status = "lost"  # type: ignore[union-attr]
    with session_scope(ctx.session_factory) as s:
        held = reachable_checkpoints(s, job_id)[a_key]
        assert (held["step"], held["node_id"], held["holders"]) == (
            10,
            target,
            [{"step": 10, "node_id": target}],
        )
        configs = {
            "new-node": {
                "region": a_key,
                "model": SPEC.model.model_dump(),
                "checkpoint": {"dir": order.dir, "fetch": {"step": 10, "source_node_id": target}},
            }
        }
        sign_fetches(s, job_id, configs)
        fetch = configs["new-node"]["checkpoint"]["fetch"]
        key = s.get(Node, target).probe_key  # type: ignore[union-attr]
        ticket = CheckpointTicket(
            fetch["transfer_id"], fetch["source_node_id"], fetch["dir"], fetch["step"],
            fetch["max_bytes"], fetch["expires_at"], fetch["mac"],
        )  # fmt: skip
        verify(key, target, ticket, time.time())
        assert fetch["port"] == s.get(Node, target).checkpoint_port  # type: ignore[union-attr]
        pending = s.get(CheckpointCopy, fetch["transfer_id"])
        assert pending is not None and (pending.purpose, pending.node_id, pending.status) == (
            "fetch",
            "new-node",
            "pending",
        )
    with session_scope(ctx.session_factory) as s:
        record_copy_result(
            ctx,
            s,
            "new-node",
            {"transfer_id": fetch["transfer_id"], "error": "source: NOT_FOUND", "assignment_id": "t1"},
        )
        kinds = [e.kind for e in s.scalars(select(Event).where(Event.job_id == job_id).order_by(Event.id))]
        assert kinds[-1] == "job.checkpoint_fetch_failed"
