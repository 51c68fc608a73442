"""The gRPC edge: real servers on loopback, health, chunked streams, error codes, deadlines."""

from __future__ import annotations

import queue
import threading

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from contracts.errors import FailedPrecondition
from proto.cpn.sync.v1 import sync_pb2, sync_pb2_grpc
from training.compression import encode_tensor, get_codec
from training.sync.messages import Meta, OutMessage, PushResult
from training.sync.stats import TransferStats
from training.sync.transport import SERVICE_NAME, PeerClient, PeerError, SyncServer
from training.wan.shaper import LinkShaper


class Region:
    region = "b"

    def __init__(self) -> None:
        self.got: list = []

    def known(self, region: str) -> bool:
        return region == "a"

    def handle_push(self, msg):  # noqa: ANN001, ANN201
        self.got.append(msg)
        return PushResult(True, "", 7)

    def handle_exchange(self, msg):  # noqa: ANN001, ANN201
        return OutMessage(
            Meta("b", msg.meta.stream), [("y", encode_tensor(msg.tensors["x"] * 2, get_codec("fp32")))]
        )

    def handle_pull(self, requester, what, min_round):  # noqa: ANN001, ANN201
        raise FailedPrecondition("not yet", field="min_round")


@pytest.fixture
def server():  # noqa: ANN201
    region = Region()
    s = SyncServer(region, LinkShaper(), TransferStats())  # type: ignore[arg-type]
    s.start()
    yield s, region
    s.stop()


def test_health_is_served(server) -> None:  # noqa: ANN001
    s, _ = server
    with grpc.insecure_channel(s.address) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        for name in ("", SERVICE_NAME):
            r = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
            assert r.status == health_pb2.HealthCheckResponse.SERVING


def test_a_large_tensor_streams_in_bounded_chunks(server) -> None:  # noqa: ANN001
    s, region = server
    x = torch.randn(600_000)  # 2.4 MB as fp32, 64 KiB chunks
    enc = encode_tensor(x, get_codec("fp32"), chunk_bytes=64 << 10)
    assert len(enc.chunks) == 37 and max(len(c.data) for c in enc.chunks) == 64 << 10
    c = PeerClient("a", "b", s.address, LinkShaper(), TransferStats())
    ack = c.push(OutMessage(Meta("a", "t", round=3), [("x", enc)]), timeout=10)
    assert ack.accepted and ack.progress == 7
    assert torch.equal(region.got[0].tensors["x"], x) and region.got[0].meta.round == 3
    reply = c.exchange(
        OutMessage(Meta("a", "t"), [("x", encode_tensor(torch.ones(3), get_codec("int8")))]), 10
    )
    assert torch.allclose(reply.tensors["y"], torch.full((3,), 2.0))
    c.close()


def test_errors_map_to_grpc_codes(server) -> None:  # noqa: ANN001
    s, _ = server
    stranger = PeerClient("zz", "b", s.address, LinkShaper(), TransferStats())
    with pytest.raises(PeerError) as e:
        stranger.push(OutMessage(Meta("zz", "t")), timeout=5)
    assert e.value.status == "NOT_FOUND"
    a = PeerClient("a", "b", s.address, LinkShaper(), TransferStats())
    with pytest.raises(PeerError) as e:
        a.pull("state", 1, timeout=5)
    assert e.value.status == "FAILED_PRECONDITION"
    with grpc.insecure_channel(s.address) as ch:  # a stream that starts with a chunk, not a header
        stub = sync_pb2_grpc.SyncServiceStub(ch)
        with pytest.raises(grpc.RpcError) as err:
            stub.Push(iter([sync_pb2.Frame(chunk=sync_pb2.Chunk(part=0))]), timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    stranger.close()
    a.close()


def test_balancing_figures_travel_and_impossible_ones_are_refused(server) -> None:  # noqa: ANN001
    s, region = server
    a = PeerClient("a", "b", s.address, LinkShaper(), TransferStats())
    a.push(OutMessage(Meta("a", "t", step_s=0.125, opened_at=1.8e9)), timeout=5)
    assert (region.got[-1].meta.step_s, region.got[-1].meta.opened_at) == (0.125, 1.8e9)
    for bad in ({"step_s": float("nan")}, {"step_s": -1.0}, {"step_s": 1e9}, {"opened_at": float("inf")}):
        with pytest.raises(PeerError) as e:
            a.push(OutMessage(Meta("a", "t", **bad)), timeout=5)  # type: ignore[arg-type]
        assert e.value.status == "INVALID_ARGUMENT" and "header." in e.value.message
    assert len(region.got) == 1  # nothing refused reached the region
    a.close()


def test_calls_to_a_dead_peer_fail_fast_with_a_status() -> None:
    c = PeerClient("a", "b", "127.0.0.1:1", LinkShaper(), TransferStats())
    with pytest.raises(PeerError) as e:
        c.push(OutMessage(Meta("a", "t")), timeout=2)
    assert e.value.status in ("UNAVAILABLE", "DEADLINE_EXCEEDED")
    c.close()


class SeriesRegion(Region):
    """Records each pushed message and sets an event per message as it is handled."""

    def __init__(self) -> None:
        super().__init__()
        self.handled = [threading.Event() for _ in range(4)]

    def handle_push(self, msg):  # noqa: ANN001, ANN201
        self.got.append(msg)
        self.handled[len(self.got) - 1].set()
        return PushResult(msg.meta.round != 2, "stale" if msg.meta.round == 2 else "", len(self.got))


def test_a_series_hands_each_message_on_as_soon_as_its_last_chunk_is_in() -> None:
    region = SeriesRegion()
    s = SyncServer(region, LinkShaper(), TransferStats())  # type: ignore[arg-type]
    s.start()
    c = PeerClient("a", "b", s.address, LinkShaper(), TransferStats())
    try:
        q: queue.SimpleQueue = queue.SimpleQueue()
        ack = c.push_series(q, timeout=30)
        xs = [torch.randn(300_000), torch.randn(10)]
        q.put(
            OutMessage(Meta("a", "t0", round=0), [("x", encode_tensor(xs[0], get_codec("fp32"), 64 << 10))])
        )
        # The first message is handled while the call is still open (nothing more has been sent).
        assert region.handled[0].wait(30) and not ack.done()
        q.put(OutMessage(Meta("a", "t1", round=1)))  # no parts: no chunk frames
        assert region.handled[1].wait(30) and not ack.done()
        q.put(OutMessage(Meta("a", "t2", round=2), [("x", encode_tensor(xs[1], get_codec("int8")))]))
        q.put(None)
        result = ack.result(30)
    finally:
        c.close()
        s.stop()
    assert [m.meta.stream for m in region.got] == ["t0", "t1", "t2"]
    assert torch.equal(region.got[0].tensors["x"], xs[0]) and region.got[1].tensors == {}
    # one answer: not accepted, with the refused message's reason, and the last progress
    assert (result.accepted, result.reason, result.progress) == (False, "stale", 3)


def _series_call(address: str, frames: list[sync_pb2.Frame]) -> grpc.RpcError:
    with grpc.insecure_channel(address) as ch, pytest.raises(grpc.RpcError) as e:
        sync_pb2_grpc.SyncServiceStub(ch).PushSeries(iter(frames), timeout=10)
    return e.value


def test_a_malformed_series_is_refused_with_invalid_argument(server) -> None:  # noqa: ANN001
    s, region = server
    chunk = sync_pb2.Frame(chunk=sync_pb2.Chunk(part=0, offset=0, numel=1, data=b"\0\0\0\0"))
    spec = sync_pb2.TensorSpec(name="x", numel=1, codec=sync_pb2.CODEC_FP32)

    def header(chunks: int) -> sync_pb2.Frame:
        return sync_pb2.Frame(header=sync_pb2.Header(sender="a", stream="t", chunks=chunks, parts=[spec]))

    cases = {
        "header.chunks": [header(-1)],
        "a header after 0 of the 1 chunks": [header(1), header(1)],
        "the stream ended after 0 of the 2 chunks": [header(2)],
        "must start with a header": [chunk],
    }
    for why, frames in cases.items():
        err = _series_call(s.address, frames)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and why in (err.details() or ""), why
    # a complete message before the malformed one was handled; the rest of the call was refused
    err = _series_call(s.address, [header(1), chunk, header(2), chunk, header(0)])
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert len(region.got) == 1
