"""Register over a real gRPC server on loopback, against a real database (SQLite, and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import grpc
import pytest
from sqlalchemy import func, select, update

from contracts.errors import InvalidArgument
from contracts.registration import ProfileReport
from control_layer.snapshot import build_snapshot
from orchestration.context import ServerContext
from orchestration.db.base import utcnow
from orchestration.db.engine import as_utc
from orchestration.db.models import (
    Accelerator,
    Allocation,
    Cluster,
    EnrollmentToken,
    Node,
    Price,
    Provider,
    Region,
)
from proto.cpn.agent.v1 import agent_pb2, agent_pb2_grpc
from proto.cpn.agent.v1.profile import profile_from_proto
from resource_layer import registry
from resource_layer.tokens import hash_token
from service_layer.queries import list_regions
from tests.resource_layer.harness import GrpcServerThread, enrollment_token, sqlite_context

Stub = agent_pb2_grpc.AgentServiceStub
# Backend-independent behaviour: SQLite only (the shared fixtures also run PostgreSQL + Redis).
SQLITE_ONLY = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


@pytest.fixture
def server(ctx: ServerContext) -> Iterator[GrpcServerThread]:
    srv = GrpcServerThread(ctx).start()
    yield srv
    srv.stop()


@pytest.fixture
def stub(server: GrpcServerThread) -> Iterator[agent_pb2_grpc.AgentServiceStub]:
    with grpc.insecure_channel(server.target) as channel:
        yield agent_pb2_grpc.AgentServiceStub(channel)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerContext, Stub]]:
    """One SQLite server for the many malformed-request cases (validation runs before any query)."""
    ctx = sqlite_context(tmp_path_factory.mktemp("shared"))
    srv = GrpcServerThread(ctx).start()
    with grpc.insecure_channel(srv.target) as channel:
        yield ctx, agent_pb2_grpc.AgentServiceStub(channel)
    srv.stop()


def request(token: str, **overrides: Any) -> agent_pb2.RegisterRequest:
    fields: dict[str, Any] = {
        "enrollment_token": token,
        "region": "eu-west",
        "cluster": "paris-1",
        "provider": "lumen",
        "hostname": "node-a",
        "price_per_device_hour": 1.2,
        "spot_price_per_device_hour": 0.5,
        "agent_version": "test",
        "advertise_host": "127.0.0.1",
        "sync_port_min": 29600,
        "sync_port_max": 29699,
        "intra_bandwidth_gbps": 50.0,
        "jurisdiction": "EU",
        "devices": [
            agent_pb2.Device(index=0, model="cpu", memory_gb=4.0, measured_tflops=0.05, kind="cpu"),
            agent_pb2.Device(index=1, model="cpu", memory_gb=4.0, measured_tflops=0.05, kind="cpu"),
        ],
    }
    fields.update(overrides)
    return agent_pb2.RegisterRequest(**fields)


def counts(ctx: ServerContext) -> dict[str, int]:
    with ctx.session_factory() as s:
        return {
            m.__tablename__: s.scalar(select(func.count()).select_from(m)) or 0
            for m in (Region, Provider, Cluster, Node, Accelerator, Price)
        }


def token_uses(ctx: ServerContext, token: str) -> int:
    with ctx.session_factory() as s:
        return (
            s.scalar(select(EnrollmentToken.uses).where(EnrollmentToken.token_hash == hash_token(token))) or 0
        )


def test_registration_upserts_the_whole_resource_tree(
    ctx: ServerContext, stub: agent_pb2_grpc.AgentServiceStub
) -> None:
    token = enrollment_token(ctx, max_uses=2)
    resp = stub.Register(request(token), timeout=10)
    assert resp.node_id and resp.node_token.startswith("cpn_node_") and resp.cluster_id
    assert resp.heartbeat_interval_s == ctx.settings.heartbeat_interval_s

    with ctx.session_factory() as s:
        node = s.get(Node, resp.node_id)
        assert node is not None
        assert node.token_hash == hash_token(resp.node_token) and resp.node_token not in node.token_hash
        assert (node.hostname, node.advertise_host, node.sync_port_min, node.sync_port_max, node.status) == (
            "node-a",
            "127.0.0.1",
            29600,
            29699,
            "alive",
        )
        cluster = s.get(Cluster, resp.cluster_id)
        assert cluster is not None and (cluster.region, cluster.name, cluster.intra_bandwidth_gbps) == (
            "eu-west",
            "paris-1",
            50.0,
        )
        assert s.get(Provider, cluster.provider_id).name == "lumen"  # type: ignore[union-attr]
        assert s.get(Region, "eu-west").jurisdiction == "EU"  # type: ignore[union-attr]
        accs = s.scalars(
            select(Accelerator).where(Accelerator.node_id == node.id).order_by(Accelerator.index)
        ).all()
        assert [(a.index, a.model, a.kind, a.memory_gb, a.measured_tflops) for a in accs] == [
            (0, "cpu", "cpu", 4.0, 0.05),
            (1, "cpu", "cpu", 4.0, 0.05),
        ]
        prices = s.scalars(select(Price).where(Price.cluster_id == cluster.id)).all()
        assert [(p.price_per_device_hour, p.spot_price_per_device_hour) for p in prices] == [(1.2, 0.5)]
    assert token_uses(ctx, token) == 1

    # A second node in the same cluster at the same price: no new region, cluster or price row.
    second = stub.Register(request(token, hostname="node-b", spot_price_per_device_hour=0.5), timeout=10)
    assert second.cluster_id == resp.cluster_id and second.node_id != resp.node_id
    assert counts(ctx) == {
        "regions": 1,
        "providers": 1,
        "clusters": 1,
        "nodes": 2,
        "accelerators": 4,
        "prices": 1,
    }


def test_reregistration_keeps_the_node_and_records_a_price_change(
    ctx: ServerContext, stub: agent_pb2_grpc.AgentServiceStub
) -> None:
    token = enrollment_token(ctx, max_uses=1)
    first = stub.Register(request(token), timeout=10)
    # Node credentials instead of the (now used-up) enrollment token; one device more, a new price.
    devices = [
        agent_pb2.Device(index=i, model="cpu", memory_gb=2.0, measured_tflops=0.07, kind="cpu")
        for i in range(3)
    ]
    again = stub.Register(
        request(
            "", node_id=first.node_id, node_token=first.node_token, price_per_device_hour=0.9, devices=devices
        ),
        timeout=10,
    )
    assert again.node_id == first.node_id and again.node_token != first.node_token
    with ctx.session_factory() as s:
        accs = s.scalars(select(Accelerator).where(Accelerator.node_id == first.node_id)).all()
        assert sorted((a.index, a.memory_gb, a.measured_tflops) for a in accs) == [
            (0, 2.0, 0.07),
            (1, 2.0, 0.07),
            (2, 2.0, 0.07),
        ]
        prices = s.scalars(select(Price).order_by(Price.effective_from)).all()
        assert [p.price_per_device_hour for p in prices] == [1.2, 0.9]
    # The old node token stopped working.
    with pytest.raises(grpc.RpcError) as err:
        stub.Register(request("", node_id=first.node_id, node_token=first.node_token), timeout=10)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


def _device(**kw: Any) -> agent_pb2.Device:
    base: dict[str, Any] = {
        "index": 0,
        "model": "cpu",
        "memory_gb": 4.0,
        "measured_tflops": 0.05,
        "kind": "cpu",
    }
    return agent_pb2.Device(**{**base, **kw})


MALFORMED: list[tuple[str, dict[str, Any], str]] = [
    ("empty region", {"region": ""}, "region: must match"),
    ("upper-case region", {"region": "EU-West"}, "region: must match"),
    ("region with a space", {"region": "eu west"}, "region: must match"),
    ("region too long", {"region": "a" * 64}, "region: must match"),
    ("empty cluster", {"cluster": ""}, "cluster: must match"),
    ("cluster starting with '-'", {"cluster": "-paris"}, "cluster: must match"),
    ("no devices", {"devices": []}, "devices: at least one device is required"),
    ("zero memory", {"devices": [_device(memory_gb=0)]}, "devices[0].memory_gb: must be a finite number > 0"),
    ("negative memory", {"devices": [_device(memory_gb=-1)]}, "devices[0].memory_gb"),
    ("zero tflops", {"devices": [_device(measured_tflops=0)]}, "devices[0].measured_tflops: must be"),
    ("NaN tflops", {"devices": [_device(measured_tflops=float("nan"))]}, "devices[0].measured_tflops"),
    ("unknown device kind", {"devices": [_device(kind="tpu")]}, "devices[0].kind: must be one of cuda, cpu"),
    ("unknown sandbox", {"sandbox": "chroot"}, "sandbox: must be one of bubblewrap"),
    ("empty device model", {"devices": [_device(model="")]}, "devices[0].model"),
    ("duplicate device index", {"devices": [_device(), _device()]}, "devices[1].index: duplicate"),
    (
        "negative price",
        {"price_per_device_hour": -0.01},
        "price_per_device_hour: must be a finite number >= 0",
    ),
    ("infinite price", {"price_per_device_hour": float("inf")}, "price_per_device_hour"),
    ("negative spot price", {"spot_price_per_device_hour": -1}, "spot_price_per_device_hour"),
    ("inverted sync ports", {"sync_port_min": 29700, "sync_port_max": 29600}, "sync_port_min/sync_port_max"),
    ("privileged sync ports", {"sync_port_min": 80, "sync_port_max": 90}, "sync_port_min/sync_port_max"),
    ("missing sync ports", {"sync_port_min": 0, "sync_port_max": 0}, "sync_port_min/sync_port_max"),
    ("sync port past 65535", {"sync_port_min": 60000, "sync_port_max": 70000}, "sync_port_min/sync_port_max"),
    ("empty advertise host", {"advertise_host": ""}, "advertise_host"),
    ("lower-case jurisdiction", {"jurisdiction": "eu"}, "jurisdiction"),
    ("negative bandwidth", {"intra_bandwidth_gbps": -5}, "intra_bandwidth_gbps"),
    ("node id without token", {"node_id": "abc"}, "node_id/node_token"),
    ("contention below any host's idle figure", {"cpu_contention": 0.0005}, "cpu_contention"),
    ("contention not a number", {"cpu_contention": float("nan")}, "cpu_contention"),
    ("a probe age below 0", {"cpu_contention_probe_ages_s": [1.0, -0.5]}, "cpu_contention_probe_ages_s"),
    (
        "a probe age not a number",
        {"cpu_contention_probe_ages_s": [float("nan")]},
        "cpu_contention_probe_ages_s",
    ),
    (
        "a probe older than a week",
        {"cpu_contention_probe_ages_s": [8 * 86_400.0]},
        "cpu_contention_probe_ages_s",
    ),
    ("more probe ages than kept", {"cpu_contention_probe_ages_s": [1.0] * 65}, "cpu_contention_probe_ages_s"),
    (
        "profile with negative start-up",
        {"measured_profile": agent_pb2.MeasuredProfile(startup_s=-1.0)},
        "measured_profile.startup_s",
    ),
    (
        "profile collective call of a negative time",
        {"measured_profile": agent_pb2.MeasuredProfile(collective_call_s=-1e-4, collective_gbps=5.0)},
        "measured_profile.collective_call_s",
    ),
    (
        "profile collective wait beyond any measurement",
        {"measured_profile": agent_pb2.MeasuredProfile(collective_wait_s=60.0)},
        "measured_profile.collective_wait_s",
    ),
    (
        "profile collective rate without its call",
        {"measured_profile": agent_pb2.MeasuredProfile(collective_gbps=5.0)},
        "measured_profile.collective_gbps",
    ),
    (
        "profile collective rate not a number",
        {"measured_profile": agent_pb2.MeasuredProfile(collective_call_s=2e-4, collective_gbps=float("nan"))},
        "measured_profile.collective_gbps",
    ),
    (
        "profile launcher longer than its start-up",
        {"measured_profile": agent_pb2.MeasuredProfile(startup_s=2.0, launcher_s=3.0)},
        "measured_profile.launcher_s",
    ),
    (
        "profile rate of zero TFLOPS",
        {"measured_profile": agent_pb2.MeasuredProfile(rates=[agent_pb2.MeasuredStepRate(precision="fp32")])},
        "measured_profile.rates[0].tflops",
    ),
    (
        "profile rate with NaN overhead",
        {
            "measured_profile": agent_pb2.MeasuredProfile(
                rates=[agent_pb2.MeasuredStepRate(precision="fp32", tflops=0.05, step_s=float("nan"))]
            )
        },
        "measured_profile.rates[0].step_s",
    ),
    (
        "profile rate of an unknown precision",
        {"measured_profile": agent_pb2.MeasuredProfile(rates=[agent_pb2.MeasuredStepRate(precision="fp8")])},
        "measured_profile.rates[0].precision",
    ),
    ("negative node fabric", {"node_fabric_gbps": -1.0}, "node_fabric_gbps"),
    ("node fabric beyond any network", {"node_fabric_gbps": 1e6}, "node_fabric_gbps"),
    ("node fabric latency not a number", {"node_fabric_latency_ms": float("nan")}, "node_fabric_latency_ms"),
    ("cross-cluster host not a host", {"cross_cluster_host": "10.0.0.1; rm"}, "cross_cluster_host"),
]


def test_a_measured_profile_is_stored_and_reaches_the_planners_snapshot(
    ctx: ServerContext, stub: agent_pb2_grpc.AgentServiceStub
) -> None:
    rate = agent_pb2.MeasuredStepRate(
        precision="fp32", tflops=0.04, micro_batch_s=0.004, step_s=0.001, optimizer_s_per_mparam=0.005,
        data_s_per_mtoken=9.0, checkpoint_s_per_mparam=0.1,
    )  # fmt: skip
    profile = agent_pb2.MeasuredProfile(
        startup_s=6.5, teardown_s=0.8, physical_cores=2, rates=[rate], launcher_s=1.25,
        collective_call_s=2.5e-4, collective_gbps=9.0, collective_wait_s=1e-3,
    )  # fmt: skip
    resp = stub.Register(request(enrollment_token(ctx), measured_profile=profile), timeout=10)
    with ctx.session_factory() as s:
        node = s.get(Node, resp.node_id)
        assert node is not None and node.profile is not None
        assert (node.profile["startup_s"], node.profile["physical_cores"]) == (6.5, 2)
        snap = build_snapshot(s)
    (info,) = [n for c in snap.clusters for n in c.nodes if n.id == resp.node_id]
    assert info.profile is not None and info.profile.teardown_s == pytest.approx(0.8)
    assert info.profile.launcher_s == pytest.approx(1.25)
    got = (info.profile.collective_call_s, info.profile.collective_gbps, info.profile.collective_wait_s)
    assert got == pytest.approx((2.5e-4, 9.0, 1e-3))
    assert info.profile.rates["fp32"].data_s_per_mtoken == pytest.approx(9.0)
    assert info.host == "node-a"


def test_a_declared_node_fabric_is_stored_and_reaches_both_snapshots(
    ctx: ServerContext, stub: agent_pb2_grpc.AgentServiceStub
) -> None:
    """What the agent declares for its own port narrows the cluster's figure in the planner's
    snapshot, rebuilt from the database and kept live, as does a declared cross-cluster host;
    re-registering without them clears them."""
    from control_layer.live_snapshot import LiveSnapshot

    slow = stub.Register(
        request(
            enrollment_token(ctx),
            node_fabric_gbps=10.0,
            node_fabric_latency_ms=0.2,
            cross_cluster_host="10.1.2.3",
        ),
        timeout=10,
    )
    plain = stub.Register(request(enrollment_token(ctx), hostname="node-b"), timeout=10)
    with ctx.session_factory() as s:
        built = build_snapshot(s)
    for snap in (built, LiveSnapshot(ctx).snapshot()):
        (cluster,) = snap.clusters
        nodes = {n.id: n for n in cluster.nodes}
        mine = nodes[slow.node_id]
        assert (mine.fabric_bandwidth_gbps, mine.fabric_latency_ms) == (10.0, 0.2)
        assert cluster.port(nodes[slow.node_id]) == (10.0, 0.2)
        assert cluster.port(nodes[plain.node_id]) == (50.0, cluster.intra_latency_ms)
        assert cluster.between(nodes[slow.node_id], nodes[plain.node_id]) == (10.0, 0.2)
        assert (mine.cross_cluster_groups, nodes[plain.node_id].cross_cluster_groups) == (True, False)
    again = stub.Register(
        request("", node_id=slow.node_id, node_token=slow.node_token, hostname="node-a"), timeout=10
    )
    with ctx.session_factory() as s:
        node = s.get(Node, again.node_id)
        assert node is not None and node.fabric_bandwidth_gbps is None and node.fabric_latency_ms is None
        assert node.cross_cluster_host is None


def test_the_sandbox_a_node_declares_is_stored_and_reaches_both_snapshots(
    ctx: ServerContext, stub: agent_pb2_grpc.AgentServiceStub
) -> None:
    """Whether a node runs users' code is what it registered with; an agent that says nothing
    (an older one) runs none."""
    from control_layer.live_snapshot import LiveSnapshot
    from service_layer.queries import list_clusters

    boxed = stub.Register(request(enrollment_token(ctx), sandbox="bubblewrap"), timeout=10)
    silent = stub.Register(request(enrollment_token(ctx), hostname="node-b"), timeout=10)
    with ctx.session_factory() as s:
        built = build_snapshot(s)
    for snap in (built, LiveSnapshot(ctx).snapshot()):
        nodes = {n.id: n for c in snap.clusters for n in c.nodes}
        assert (nodes[boxed.node_id].sandbox, nodes[silent.node_id].sandbox) == ("bubblewrap", "none")
    with ctx.session_factory() as s:  # and the node API shows it
        shown = {n.id: n.sandbox for c in list_clusters(s, ctx.bus) for n in c.nodes}
    assert (shown[boxed.node_id], shown[silent.node_id]) == ("bubblewrap", "none")
    again = stub.Register(
        request("", node_id=boxed.node_id, node_token=boxed.node_token, sandbox="unsandboxed-allowed"),
        timeout=10,
    )
    with ctx.session_factory() as s:
        node = s.get(Node, again.node_id)
        assert node is not None and node.sandbox == "unsandboxed-allowed"


@pytest.mark.parametrize(("case", "overrides", "reason"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_registration_is_refused_with_the_reason_and_writes_nothing(
    shared: tuple[ServerContext, Stub], case: str, overrides: dict[str, Any], reason: str
) -> None:
    ctx, stub = shared
    token = enrollment_token(ctx)
    before = counts(ctx)
    with pytest.raises(grpc.RpcError) as err:
        stub.Register(request(token, **overrides), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, case
    assert reason in err.value.details()
    assert counts(ctx) == before
    assert token_uses(ctx, token) == 0


@SQLITE_ONLY
def test_every_problem_is_reported_at_once(ctx: ServerContext, stub: agent_pb2_grpc.AgentServiceStub) -> None:
    with pytest.raises(grpc.RpcError) as err:
        stub.Register(
            request(enrollment_token(ctx), region="", devices=[], price_per_device_hour=-1), timeout=10
        )
    details = err.value.details()
    assert all(f in details for f in ("region:", "devices:", "price_per_device_hour:"))


def _expired(ctx: ServerContext) -> str:
    token = enrollment_token(ctx, ttl_s=60)
    with ctx.session_factory() as s, s.begin():
        row = s.scalars(select(EnrollmentToken).where(EnrollmentToken.token_hash == hash_token(token))).one()
        row.expires_at = utcnow() - timedelta(seconds=1)
    return token


BAD_TOKENS: list[tuple[str, Callable[[ServerContext], str]]] = [
    ("unknown", lambda ctx: "cpn_enroll_not-a-real-token"),
    ("empty", lambda ctx: ""),
    ("expired", _expired),
]


@pytest.mark.parametrize(("case", "make"), BAD_TOKENS, ids=[b[0] for b in BAD_TOKENS])
@SQLITE_ONLY
def test_bad_token_is_unauthenticated(
    ctx: ServerContext, stub: agent_pb2_grpc.AgentServiceStub, case: str, make: Callable[[ServerContext], str]
) -> None:
    token = make(ctx)
    before = counts(ctx)
    with pytest.raises(grpc.RpcError) as err:
        stub.Register(request(token), timeout=10)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, case
    assert counts(ctx) == before


@SQLITE_ONLY
def test_used_up_token_is_unauthenticated(ctx: ServerContext, stub: agent_pb2_grpc.AgentServiceStub) -> None:
    token = enrollment_token(ctx, max_uses=1)
    stub.Register(request(token), timeout=10)
    before = counts(ctx)
    with pytest.raises(grpc.RpcError) as err:
        stub.Register(request(token, hostname="node-b"), timeout=10)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert counts(ctx) == before and token_uses(ctx, token) == 1


@pytest.mark.parametrize("provider", ["", "x" * 129, "a/b"])
@SQLITE_ONLY
def test_no_token_is_issued_for_an_empty_or_malformed_provider(ctx: ServerContext, provider: str) -> None:
    """A node's provider is its token's: a token for no provider would enroll nodes that own no
    cluster and could join any (the ownership check compares provider names)."""
    with pytest.raises(InvalidArgument) as err:
        enrollment_token(ctx, provider=provider)
    assert err.value.details["field"] == "provider"
    with ctx.session_factory() as s:
        assert s.scalar(select(func.count()).select_from(EnrollmentToken)) == 0


@SQLITE_ONLY
def test_a_token_enrolls_only_its_providers_nodes_into_its_providers_clusters(
    ctx: ServerContext, stub: agent_pb2_grpc.AgentServiceStub
) -> None:
    lumen = enrollment_token(ctx, provider="lumen", max_uses=3)
    stub.Register(request(lumen), timeout=10)  # lumen's eu-west/paris-1 at its price
    before = counts(ctx)
    # Another provider's token cannot join lumen's cluster, nor reprice it, whatever name it gives.
    rival = enrollment_token(ctx, provider="rival", max_uses=3)
    for provider in ("", "rival", "lumen"):
        with pytest.raises(grpc.RpcError) as err:
            stub.Register(request(rival, provider=provider, price_per_device_hour=0.0001), timeout=10)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, provider
    assert counts(ctx) == before and token_uses(ctx, rival) == 0  # refused attempts roll back whole
    with ctx.session_factory() as s:
        assert [p.price_per_device_hour for p in s.scalars(select(Price))] == [1.2]
    # A lumen token cannot enroll a node that says it belongs to someone else.
    with pytest.raises(grpc.RpcError) as err:
        stub.Register(request(lumen, provider="someone-else"), timeout=10)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "enroll nodes of provider 'lumen'" in err.value.details()
    # The rival's token works for its own cluster.
    stub.Register(request(rival, provider="rival", cluster="paris-2"), timeout=10)
    assert token_uses(ctx, rival) == 1


@SQLITE_ONLY
def test_health_and_reflection_are_on(server: GrpcServerThread) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    with grpc.insecure_channel(server.target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "cpn.agent.v1.AgentService"):
            status = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status
            assert status == health_pb2.HealthCheckResponse.SERVING
        refl = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = refl.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
        )
        names = {s.name for r in replies for s in r.list_services_response.service}
        assert "cpn.agent.v1.AgentService" in names


def test_heartbeats_keep_the_hosts_cpu_contention_and_ignore_what_is_not_one(
    ctx: ServerContext, stub: agent_pb2_grpc.AgentServiceStub
) -> None:
    resp = stub.Register(request(enrollment_token(ctx)), timeout=10)
    registry.heartbeat(ctx, resp.node_id, persist=True, contention=2.5)
    for bad in (float("nan"), float("inf"), 0.0005, -1.0):
        registry.heartbeat(ctx, resp.node_id, persist=True, contention=bad)
    registry.heartbeat(ctx, resp.node_id, persist=False, contention=9.0)  # not persisted: not stored
    with ctx.session_factory() as s:
        node = s.get(Node, resp.node_id)
        assert node is not None and node.cpu_contention == 2.5
        (info,) = [n for c in build_snapshot(s).clusters for n in c.nodes if n.id == resp.node_id]
    assert info.cpu_contention == 2.5


def test_the_contention_a_node_registers_with_reaches_both_snapshots_and_none_keeps_the_last(
    ctx: ServerContext, stub: agent_pb2_grpc.AgentServiceStub
) -> None:
    """A quote made right after registration, before any heartbeat, prices CPU slots by the figure
    the agent took after its own start-up; re-registering without one keeps the stored figure."""
    from control_layer.live_snapshot import LiveSnapshot

    resp = stub.Register(request(enrollment_token(ctx), cpu_contention=1.4), timeout=10)
    with ctx.session_factory() as s:
        built = build_snapshot(s)
    for snap in (built, LiveSnapshot(ctx).snapshot()):
        (info,) = [n for c in snap.clusters for n in c.nodes if n.id == resp.node_id]
        assert info.cpu_contention == 1.4
    stub.Register(request("", node_id=resp.node_id, node_token=resp.node_token), timeout=10)
    with ctx.session_factory() as s:
        assert s.get_one(Node, resp.node_id).cpu_contention == 1.4


def test_one_batch_records_every_node_heard_revives_the_lost_and_keeps_each_contention(
    ctx: ServerContext, stub: agent_pb2_grpc.AgentServiceStub
) -> None:
    ids = [
        stub.Register(request(enrollment_token(ctx), hostname=f"h{i}"), timeout=10).node_id for i in range(3)
    ]
    before = utcnow()
    with ctx.session_factory() as s, s.begin():
        s.get_one(Node, ids[0]).status = "lost"
        s.get_one(Node, ids[2]).status = "drained"
    registry.persist_heartbeats(ctx, {ids[0]: 3.0, ids[1]: None, ids[2]: float("inf")})
    with ctx.session_factory() as s:
        nodes = [s.get_one(Node, i) for i in ids]
    assert [n.status for n in nodes] == ["alive", "alive", "drained"]  # drained stays drained
    assert all(n.last_heartbeat_at is not None and as_utc(n.last_heartbeat_at) >= before for n in nodes)
    assert [n.cpu_contention for n in nodes] == [3.0, None, None]
    # a second batch moves only the figure that changed by more than the noise threshold
    registry.persist_heartbeats(ctx, {ids[0]: 3.1, ids[1]: 2.0})
    with ctx.session_factory() as s:
        assert [s.get_one(Node, i).cpu_contention for i in ids[:2]] == [3.0, 2.0]


def test_a_figure_is_stored_with_the_other_nodes_slots_busy_at_its_probes(
    ctx: ServerContext, stub: agent_pb2_grpc.AgentServiceStub
) -> None:
    """Two agents on one host: what one measured beside the other's job is stored with the slots
    that job held at its probes (its own slots and other hosts' are not counted), and the planner
    takes them out once the job is gone."""
    from control_layer.planner.host_shares import host_shares
    from control_layer.planner.plan_types import PlannedTask
    from tests.orchestration.fleet import add_tenant, hold_devices

    profile = agent_pb2.MeasuredProfile(startup_s=1.0, teardown_s=0.1, physical_cores=2, host_load_factor=1.0)
    a, b, far = (
        stub.Register(
            request(enrollment_token(ctx), hostname=h, cluster=cl, measured_profile=profile), timeout=10
        ).node_id
        for h, cl in (("shared", "c-a"), ("shared", "c-b"), ("elsewhere", "c-c"))
    )
    with ctx.session_factory() as s, s.begin():
        tenant = add_tenant(s)
        held_b = hold_devices(s, tenant, s.get_one(Node, b), [0, 1])  # b's job: 2 slots on the host
        hold_devices(s, tenant, s.get_one(Node, a), [0])  # a's own: its agent is not probing then
        hold_devices(s, tenant, s.get_one(Node, far), [0, 1])  # another host's
    now = utcnow()
    before = now - timedelta(hours=1)  # before any of the jobs
    # a measured 1.5 runnable threads a core on the 2 cores: b's 2 workers and its own probe;
    # half its kept probes before b's job started.
    registry.persist_heartbeats(ctx, {a: 1.5}, {a: [before, now, before, now]})
    with ctx.session_factory() as s:
        node = s.get_one(Node, a)
        assert (node.cpu_contention, node.cpu_contention_busy) == (1.5, 1.0)
    registry.persist_heartbeats(ctx, {a: 1.5}, {a: [now, now]})  # all beside b's job now
    with ctx.session_factory() as s:
        assert s.get_one(Node, a).cpu_contention_busy == 2.0
        snap = build_snapshot(s)
    (cluster,) = [c.id for c in snap.clusters if any(n.id == a for n in c.nodes)]
    task = PlannedTask(dp_rank=0, pp_stage=0, tp_rank=0, cluster=cluster, node=a, device=1)
    # b's job still runs: its 2 slots, the plan's 1 (a's own held slot is a job too) on 2 cores
    assert host_shares(snap, [task])[a] == pytest.approx((2 + 1 + 1) / 2)
    with ctx.session_factory() as s, s.begin():
        s.execute(
            update(Allocation)
            .where(Allocation.task_id == held_b.id)
            .values(active=False, released_at=utcnow())
        )
        snap = build_snapshot(s)
    assert host_shares(snap, [task])[a] == pytest.approx((1 + 1) / 2)  # b's job over: not priced
    # Without probe instants (an older agent) a figure that moves is stored as the host's.
    registry.persist_heartbeats(ctx, {a: 2.5})
    with ctx.session_factory() as s:
        node = s.get_one(Node, a)
        assert (node.cpu_contention, node.cpu_contention_busy) == (2.5, None)


def test_a_registration_counts_the_slots_busy_at_its_settle_probes(
    ctx: ServerContext, stub: agent_pb2_grpc.AgentServiceStub
) -> None:
    from tests.orchestration.fleet import add_tenant, hold_devices

    first = stub.Register(request(enrollment_token(ctx), hostname="shared"), timeout=10).node_id
    with ctx.session_factory() as s, s.begin():
        held = hold_devices(s, add_tenant(s), s.get_one(Node, first), [0, 1])
        # held since before the second agent's settle probes (ages 0.5 and 1 s)
        s.execute(
            update(Allocation)
            .where(Allocation.task_id == held.id)
            .values(created_at=utcnow() - timedelta(minutes=5))
        )
    second = stub.Register(
        request(
            enrollment_token(ctx),
            hostname="shared",
            cpu_contention=1.5,
            cpu_contention_probe_ages_s=[0.5, 1.0],
        ),
        timeout=10,
    ).node_id
    with ctx.session_factory() as s:
        node = s.get_one(Node, second)
        assert (node.cpu_contention, node.cpu_contention_busy) == (1.5, 2.0)


def _measured_profile() -> agent_pb2.MeasuredProfile:
    rate = agent_pb2.MeasuredStepRate(
        precision="fp32", tflops=0.04, micro_batch_s=0.004, step_s=0.001, optimizer_s_per_mparam=0.005,
        data_s_per_mtoken=9.0, checkpoint_s_per_mparam=0.1,
    )  # fmt: skip
    return agent_pb2.MeasuredProfile(startup_s=6.5, teardown_s=0.8, physical_cores=2, rates=[rate])


def _placeable(ctx: ServerContext) -> set[str]:
    """Node ids the planner sees, in the snapshot rebuilt from the database and the live one."""
    from control_layer.live_snapshot import LiveSnapshot

    with ctx.session_factory() as s:
        built = {n.id for c in build_snapshot(s).clusters for n in c.nodes}
    live = {n.id for c in LiveSnapshot(ctx).snapshot().clusters for n in c.nodes}
    assert built == live
    return built


@SQLITE_ONLY
def test_a_node_whose_profile_follows_is_measuring_and_unplaced_until_the_profile_lands(
    ctx: ServerContext, stub: agent_pb2_grpc.AgentServiceStub
) -> None:
    measuring = stub.Register(request(enrollment_token(ctx), profile_follows=True), timeout=10)
    declared = stub.Register(request(enrollment_token(ctx), hostname="node-b"), timeout=10)
    with ctx.session_factory() as s:
        node = s.get(Node, measuring.node_id)
        assert node is not None and node.measuring and node.profile is None
    assert _placeable(ctx) == {declared.node_id}  # a node that measures nothing is placed at once
    with ctx.session_factory() as s:  # what GET /v1/regions shows: one placeable, one measuring
        (region,) = list_regions(s)
        assert (region.alive_nodes, region.measuring_nodes) == (1, 1)

    bad = _measured_profile()
    bad.startup_s = float("nan")
    with ctx.session_factory() as s, s.begin(), pytest.raises(InvalidArgument, match="startup_s"):
        registry.record_profile(s, measuring.node_id, ProfileReport(profile_from_proto(bad)))
    noisy = ProfileReport(profile_from_proto(_measured_profile()), cpu_contention=float("inf"))
    with (
        ctx.session_factory() as s,
        s.begin(),
        pytest.raises(InvalidArgument, match="profile.cpu_contention"),
    ):
        registry.record_profile(s, measuring.node_id, noisy)
    with ctx.session_factory() as s:
        assert s.get(Node, measuring.node_id).measuring  # type: ignore[union-attr]

    with ctx.session_factory() as s, s.begin():
        registry.record_profile(
            s, measuring.node_id, ProfileReport(profile_from_proto(_measured_profile()), cpu_contention=0.75)
        )
    with ctx.session_factory() as s:
        node = s.get(Node, measuring.node_id)
        assert node is not None and not node.measuring and node.profile["startup_s"] == 6.5
        assert node.cpu_contention == 0.75  # settled after the measurement: the first quotes price it
    assert _placeable(ctx) == {declared.node_id, measuring.node_id}
    with ctx.session_factory() as s:
        (region,) = list_regions(s)
        assert (region.alive_nodes, region.measuring_nodes) == (2, 0)


@SQLITE_ONLY
def test_a_failed_measurement_leaves_the_node_placeable_on_its_declared_figures(
    ctx: ServerContext, stub: agent_pb2_grpc.AgentServiceStub
) -> None:
    resp = stub.Register(request(enrollment_token(ctx), profile_follows=True), timeout=10)
    assert _placeable(ctx) == set()
    with ctx.session_factory() as s, s.begin():
        registry.record_profile(s, resp.node_id, ProfileReport(None, "the reference step gave no profile"))
    with ctx.session_factory() as s:
        node = s.get(Node, resp.node_id)
        assert node is not None and not node.measuring and node.profile is None
    assert _placeable(ctx) == {resp.node_id}


@SQLITE_ONLY
def test_a_reregistration_with_the_profile_ends_measuring(
    ctx: ServerContext, stub: agent_pb2_grpc.AgentServiceStub
) -> None:
    first = stub.Register(request(enrollment_token(ctx), profile_follows=True), timeout=10)
    again = stub.Register(
        request("", node_id=first.node_id, node_token=first.node_token, measured_profile=_measured_profile()),
        timeout=10,
    )
    assert again.node_id == first.node_id
    assert _placeable(ctx) == {first.node_id}
