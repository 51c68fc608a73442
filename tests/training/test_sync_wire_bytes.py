"""The transport's byte counts against what gRPC really serialized on loopback.

Each side talks to a plain gRPC peer whose (de)serializers record the length of every message as
gRPC hands it over, so the reference shares no counting code with the transport: the counts must
equal the recorded lengths plus gRPC's 5-byte length prefix per message, for every call of the
sync service (streams, acks, unary calls).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent import futures

import grpc
import pytest
import torch

from contracts.errors import FailedPrecondition
from proto.cpn.sync.v1 import sync_pb2
from training.compression import encode_tensor, get_codec
from training.sync.messages import Meta, OutMessage, PeerStatus, PushResult
from training.sync.stats import TransferStats
from training.sync.transport import PeerClient, SyncServer
from training.wan.shaper import LinkShaper

SVC = "/cpn.sync.v1.SyncService/"
PREFIX = 5


class Tape:
    """Lengths of the serialized messages each way, as gRPC saw them."""

    def __init__(self) -> None:
        self.out: list[int] = []
        self.into: list[int] = []

    def ser(self) -> Callable[[object], bytes]:
        def f(m: object) -> bytes:
            b = m.SerializeToString()  # type: ignore[attr-defined]
            self.out.append(len(b))
            return b

        return f

    def de(self, cls: type) -> Callable[[bytes], object]:
        def f(b: bytes) -> object:
            self.into.append(len(b))
            return cls.FromString(b)

        return f

    def wire(self, side: list[int]) -> int:
        return sum(n + PREFIX for n in side)


def _payload(n: int = 50_000) -> OutMessage:
    enc = encode_tensor(torch.randn(n), get_codec("fp32"), chunk_bytes=16 << 10)
    return OutMessage(Meta("a", "t", round=1), [("x", enc)])


def test_client_counts_equal_the_serialized_messages() -> None:
    tape = Tape()

    def push(it, ctx):  # noqa: ANN001, ANN202
        for _ in it:
            pass
        return sync_pb2.PushAck(receiver="b", accepted=True, progress=3)

    def exchange(it, ctx):  # noqa: ANN001, ANN202
        for _ in it:
            pass
        enc = encode_tensor(torch.ones(9000), get_codec("int8"))
        yield sync_pb2.Frame(
            header=sync_pb2.Header(
                sender="b",
                stream="t",
                parts=[sync_pb2.TensorSpec(name="y", numel=9000, codec=sync_pb2.CODEC_INT8)],
            )
        )
        for c in enc.chunks:
            yield sync_pb2.Frame(
                chunk=sync_pb2.Chunk(
                    part=0, offset=c.offset, numel=c.numel, data=c.data, scales=c.scales, block=c.block
                )
            )

    def pull(req, ctx):  # noqa: ANN001, ANN202
        yield sync_pb2.Frame(header=sync_pb2.Header(sender="b", stream="state"))

    def hello(req, ctx):  # noqa: ANN001, ANN202
        return sync_pb2.HelloResponse(responder="b", ready=True, progress=4, step=17, mode="diloco")

    def leave(req, ctx):  # noqa: ANN001, ANN202
        return sync_pb2.LeaveResponse()

    handlers = {
        "Push": grpc.stream_unary_rpc_method_handler(
            push, request_deserializer=tape.de(sync_pb2.Frame), response_serializer=tape.ser()
        ),
        "Exchange": grpc.stream_stream_rpc_method_handler(
            exchange, request_deserializer=tape.de(sync_pb2.Frame), response_serializer=tape.ser()
        ),
        "Pull": grpc.unary_stream_rpc_method_handler(
            pull, request_deserializer=tape.de(sync_pb2.PullRequest), response_serializer=tape.ser()
        ),
        "Hello": grpc.unary_unary_rpc_method_handler(
            hello, request_deserializer=tape.de(sync_pb2.HelloRequest), response_serializer=tape.ser()
        ),
        "Leave": grpc.unary_unary_rpc_method_handler(
            leave, request_deserializer=tape.de(sync_pb2.LeaveRequest), response_serializer=tape.ser()
        ),
    }
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("cpn.sync.v1.SyncService", handlers),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    stats = TransferStats()
    c = PeerClient("a", "b", f"127.0.0.1:{port}", LinkShaper(), stats)
    try:
        assert c.push(_payload(), timeout=10).progress == 3
        assert c.exchange(_payload(3000), timeout=10).tensors["y"].numel() == 9000
        c.pull("state", 0, timeout=10)
        req = sync_pb2.HelloRequest(sender="a", address="127.0.0.1:9", ready=True, next_round=2, step=5)
        assert c.hello(req, timeout=10).step == 17
        c.leave("finished", timeout=10)
    finally:
        c.close()
        server.stop(0)
    # A chunked stream: many messages each way, so a missed prefix or message would show.
    assert len(tape.into) > 10 and len(tape.out) > 3
    assert stats.total_sent["b"] == tape.wire(tape.into)
    assert stats.total_recv["b"] == tape.wire(tape.out)


class Region:
    region = "b"

    def known(self, region: str) -> bool:
        return region == "a"

    def handle_push(self, msg):  # noqa: ANN001, ANN201
        return PushResult(True, "", 7)

    def handle_exchange(self, msg):  # noqa: ANN001, ANN201
        y = encode_tensor(msg.tensors["x"] * 2, get_codec("fp32"), chunk_bytes=16 << 10)
        return OutMessage(Meta("b", msg.meta.stream), [("y", y)])

    def handle_pull(self, requester, what, min_round):  # noqa: ANN001, ANN201
        raise FailedPrecondition("not yet", field="min_round")

    def handle_hello(self, req):  # noqa: ANN001, ANN201
        return PeerStatus("b", True, 2, 2, 40, "diloco", True, 3)

    def handle_leave(self, sender: str) -> None:
        pass


def test_server_counts_equal_the_serialized_messages() -> None:
    stats = TransferStats()
    s = SyncServer(Region(), LinkShaper(), stats)  # type: ignore[arg-type]
    s.start()
    tape = Tape()
    # The requests a peer's transport would send, built by the transport's own client on a
    # throwaway stats object, then sent through the recording channel.
    frames = list(_frames(_payload()))
    try:
        with grpc.insecure_channel(s.address) as ch:
            call = ch.stream_unary(
                SVC + "Push", request_serializer=tape.ser(), response_deserializer=tape.de(sync_pb2.PushAck)
            )
            assert call(iter(frames), timeout=10).accepted
            call = ch.stream_stream(
                SVC + "Exchange", request_serializer=tape.ser(), response_deserializer=tape.de(sync_pb2.Frame)
            )
            assert len(list(call(iter(frames), timeout=10))) > 3
            call = ch.unary_unary(
                SVC + "Hello",
                request_serializer=tape.ser(),
                response_deserializer=tape.de(sync_pb2.HelloResponse),
            )
            assert call(sync_pb2.HelloRequest(sender="a", ready=True), timeout=10).include_from == 3
            call = ch.unary_unary(
                SVC + "Leave",
                request_serializer=tape.ser(),
                response_deserializer=tape.de(sync_pb2.LeaveResponse),
            )
            call(sync_pb2.LeaveRequest(sender="a", reason="finished"), timeout=10)
            call = ch.unary_stream(
                SVC + "Pull", request_serializer=tape.ser(), response_deserializer=tape.de(sync_pb2.Frame)
            )
            with pytest.raises(grpc.RpcError):
                list(call(sync_pb2.PullRequest(requester="a", what="state", min_round=9), timeout=10))
    finally:
        s.stop()
    assert stats.total_recv["a"] == tape.wire(tape.out)
    assert stats.total_sent["a"] == tape.wire(tape.into)


def _frames(msg: OutMessage):  # noqa: ANN202
    from training.sync.transport import frames

    return frames(msg, "a", "b", LinkShaper(), TransferStats())
