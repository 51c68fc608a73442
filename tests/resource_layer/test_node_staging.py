"""What nodes report of staging, over a real gRPC server and database: the store probe offered at
registration (signed URLs of blobs the store keeps), the figures an agent measured with it, and its
cache, which quotes read back for the digests a job stages (``job_refs.node_staging_facts``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from urllib.parse import unquote

import grpc
import pytest
from sqlalchemy import select

from contracts.artifacts import ArtifactTicket, parse_uri, verify_ticket
from contracts.job_spec import JobSpec
from control_layer.job_refs import node_staging_facts
from control_layer.planner.staging import NodeStaging
from control_layer.user_data import ResolvedRef, ResolvedRefs
from orchestration.artifacts.probe import SMALL_BYTES
from orchestration.artifacts.urls import artifact_key
from orchestration.context import ServerContext
from orchestration.db.models import Node, NodeCacheEntry
from proto.cpn.agent.v1 import agent_pb2, agent_pb2_grpc
from tests.resource_layer.harness import GrpcServerThread, enrollment_token, wait_for
from tests.resource_layer.test_stream import Stream, hello

Stub = agent_pb2_grpc.AgentServiceStub
CODE, SHARD, REQS, OTHER = ("sha256:" + c * 64 for c in "abcd")


@pytest.fixture
def stub(ctx: ServerContext) -> Iterator[Stub]:
    srv = GrpcServerThread(ctx, heartbeat_db_every_s=0.0).start()
    with grpc.insecure_channel(srv.target) as channel:
        yield agent_pb2_grpc.AgentServiceStub(channel)
    srv.stop()


def _register(ctx: ServerContext, stub: Stub) -> agent_pb2.RegisterResponse:
    device = agent_pb2.Device(index=0, model="cpu", memory_gb=1.0, measured_tflops=0.01, kind="cpu")
    request = agent_pb2.RegisterRequest(
        enrollment_token=enrollment_token(ctx),
        region="eu-west",
        cluster="paris-1",
        devices=[device],
        price_per_device_hour=1.0,
        advertise_host="127.0.0.1",
        sync_port_min=29600,
        sync_port_max=29610,
    )
    return stub.Register(request, timeout=30)


def test_registration_offers_the_store_probe_on_the_route_tasks_stage_from(
    ctx: ServerContext, stub: Stub
) -> None:
    response = _register(ctx, stub)
    small, bulk = response.store_probe.blobs
    assert (small.bytes, bulk.bytes) == (SMALL_BYTES, ctx.settings.link_probe_bytes)
    for b in (small, bulk):
        assert ctx.artifacts.size(b.digest) == b.bytes  # kept in the store, not made up per request
        path, _, query = b.url.partition("?ticket=")
        assert path.endswith(f"/v1/artifacts/content/{b.digest}")
        ticket = ArtifactTicket.decode(unquote(query))
        verify_ticket(artifact_key(ctx.settings), ticket, action="get", target=b.digest, now=time.time())
        assert ticket.max_bytes == b.bytes


def test_the_probe_figures_and_the_cache_are_kept_and_read_back_for_a_jobs_digests(
    ctx: ServerContext, stub: Stub
) -> None:
    node = _register(ctx, stub)
    s = Stream(stub)
    s.send(hello=hello(node))
    s.recv()  # the ack
    figures = agent_pb2.StagingProbeResult(
        fetch_fixed_s=0.05, bytes_per_s=2.5e6, probe_bytes=4 << 20, venv_s=1.1
    )
    s.send(staging_probe=figures)
    s.send(cache=agent_pb2.CacheReport(blobs=[CODE, SHARD, OTHER], venvs=[REQS]))

    def cache() -> set[tuple[str, str]]:
        with ctx.session_factory() as session:
            return {(e.kind, e.digest) for e in session.scalars(select(NodeCacheEntry))}

    wait_for(lambda: len(cache()) == 4, what="the cache report")
    # A later report is the cache now (a blob evicted); a malformed one changes nothing.
    s.send(cache=agent_pb2.CacheReport(blobs=[CODE], venvs=[REQS]))
    wait_for(lambda: cache() == {("blob", CODE), ("venv", REQS)}, what="the second report")
    s.send(cache=agent_pb2.CacheReport(blobs=["sha256:not-a-digest"]))
    s.send(staging_probe=agent_pb2.StagingProbeResult(bytes_per_s=-1.0))
    s.send(heartbeat=agent_pb2.Heartbeat(seq=1))  # the stream goes on after a refused message
    time.sleep(0.5)
    assert cache() == {("blob", CODE), ("venv", REQS)}
    with ctx.session_factory() as session:
        stored = session.get(Node, node.node_id).staging_probe  # type: ignore[union-attr]
    assert stored is not None and stored["bytes_per_s"] == 2.5e6 and stored["venv_s"] == pytest.approx(1.1)

    spec = JobSpec.model_validate(
        {
            "name": "t",
            "entrypoint": "train:build",
            "model": {"n_layers": 1, "d_model": 8, "n_heads": 2, "vocab": 16, "seq_len": 8},
            "training": {"steps": 2, "global_batch_tokens": 64},
            "code": {"digest": CODE, "requirements_digest": REQS},
            "data": {"shards": {"eu-west": {"uri": f"artifact:{SHARD}", "resident": True}}},
        }
    )
    refs = ResolvedRefs(
        code=ResolvedRef("code.digest", parse_uri(f"artifact:{CODE}", "code"), 10),
        shards={"eu-west": ResolvedRef("data", parse_uri(f"artifact:{SHARD}", "data"), 20)},
    )
    with ctx.session_factory() as session:
        facts = node_staging_facts(session, refs, spec)
    assert facts.measured == {node.node_id: NodeStaging(fetch_fixed_s=0.05, bytes_per_s=2.5e6, venv_s=1.1)}
    assert facts.cached == {node.node_id: [CODE]} and facts.venvs == {node.node_id: [REQS]}
    staging = refs.staging(spec, None, facts)
    assert staging.code.digest == CODE and staging.shards["eu-west"].digest == SHARD
    assert staging.requirements_digest == REQS
    s.close()
