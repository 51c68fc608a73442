"""Only the job's own leaders may call a leader's sync service: every call is signed with the
job's secret, and anything else is refused before the handler runs."""

from __future__ import annotations

import time

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from proto.cpn.sync.v1 import sync_pb2, sync_pb2_grpc
from tests.training.test_sync_transport import Region
from training.compression import encode_tensor, get_codec
from training.sync.auth import MAC_KEY, PEER_KEY, TS_KEY, sign, verify
from training.sync.messages import Meta, OutMessage
from training.sync.stats import TransferStats
from training.sync.transport import PeerClient, PeerError, SyncServer
from training.wan.shaper import LinkShaper

SECRET = "ab" * 32


@pytest.fixture
def server():  # noqa: ANN201
    region = Region()
    s = SyncServer(region, LinkShaper(), TransferStats(), auth_secret=SECRET)  # type: ignore[arg-type]
    s.start()
    yield s, region
    s.stop()


def _push(client: PeerClient) -> None:
    x = encode_tensor(torch.ones(4), get_codec("fp32"))
    client.push(OutMessage(Meta("a", "t", round=1), [("x", x)]), timeout=10)


def test_a_signed_peer_gets_through(server) -> None:  # noqa: ANN001
    s, region = server
    client = PeerClient("a", "b", s.address, LinkShaper(), TransferStats(), auth_secret=SECRET)
    _push(client)
    assert len(region.got) == 1
    client.close()


@pytest.mark.parametrize("secret", [None, "cd" * 32])
def test_an_unsigned_or_wrongly_signed_caller_is_refused_before_the_handler(server, secret) -> None:  # noqa: ANN001
    s, region = server
    client = PeerClient("a", "b", s.address, LinkShaper(), TransferStats(), auth_secret=secret)
    with pytest.raises(PeerError) as e:
        _push(client)
    assert e.value.status == "UNAUTHENTICATED"
    with pytest.raises(PeerError) as e:
        client.hello(sync_pb2.HelloRequest(sender="a"), timeout=5)
    assert e.value.status == "UNAUTHENTICATED"
    assert region.got == []
    client.close()


def test_a_replayed_signature_is_stale_and_bound_to_its_method(server) -> None:  # noqa: ANN001
    s, _ = server
    old = f"{time.time() - 3600:.3f}"
    method = "/cpn.sync.v1.SyncService/Hello"
    with grpc.insecure_channel(s.address) as ch:
        stub = sync_pb2_grpc.SyncServiceStub(ch)
        stale = [(PEER_KEY, "a"), (TS_KEY, old), (MAC_KEY, sign(SECRET, "a", method, old))]
        with pytest.raises(grpc.RpcError) as e:
            stub.Hello(sync_pb2.HelloRequest(sender="a"), metadata=stale, timeout=5)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED and "clock" in (e.value.details() or "")
        # health stays open for probes
        health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    now = f"{time.time():.3f}"
    meta = {PEER_KEY: "a", TS_KEY: now, MAC_KEY: sign(SECRET, "a", method, now)}
    assert verify(SECRET, meta, method) is None
    assert verify(SECRET, meta, "/cpn.sync.v1.SyncService/Push") == "bad sync credentials"
