"""gRPC transport between region leaders: framing, shaping, a servicer that converts and
delegates, and a client whose every call carries a deadline.

Tensors travel as a Header frame followed by Chunk frames encoded one at a time, so a message of
any size is a stream of frames no larger than ``chunk_bytes`` (plus a few bytes of framing), and
gRPC's HTTP/2 flow control keeps the sender from running ahead of the receiver.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent import futures
from concurrent.futures import Future
from queue import SimpleQueue
from typing import Protocol

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from contracts.errors import CpnError, FailedPrecondition, InvalidArgument, NotFound, PermissionDenied
from proto.cpn.sync.v1 import sync_pb2, sync_pb2_grpc
from training.compression.codecs import EncodedChunk, EncodedTensor, decode_chunk_into, get_codec
from training.sync.algorithms.balance import MAX_STEP_S
from training.sync.auth import ClientAuth, ServerAuth
from training.sync.messages import InMessage, Meta, OutMessage, PeerStatus, PushResult
from training.sync.stats import TransferStats
from training.sync.tls import SyncTls
from training.wan.shaper import LinkShaper

SERVICE_NAME = sync_pb2.DESCRIPTOR.services_by_name["SyncService"].full_name
_CODEC_TO_PB = {
    "fp32": sync_pb2.CODEC_FP32,
    "fp16": sync_pb2.CODEC_FP16,
    "bf16": sync_pb2.CODEC_BF16,
    "int8": sync_pb2.CODEC_INT8,
    "topk": sync_pb2.CODEC_TOPK,
}
_PB_TO_CODEC = {v: k for k, v in _CODEC_TO_PB.items()}
_GRPC_PREFIX = 5  # bytes of gRPC length-prefix per message
MAX_MESSAGE = 8 << 20
MAX_WALL_CLOCK = 1e11  # unix seconds: about year 5138; only bounds what a peer may send
_OPTIONS = [("grpc.max_send_message_length", MAX_MESSAGE), ("grpc.max_receive_message_length", MAX_MESSAGE)]


class PeerError(CpnError):
    """A call to a peer failed; ``status`` is the gRPC status name (UNAVAILABLE, DEADLINE_EXCEEDED...)."""

    code = "peer_error"

    def __init__(self, peer: str, status: str, message: str) -> None:
        super().__init__(f"{peer}: {status}: {message}", peer=peer, status=status)
        self.peer, self.status = peer, status


class Handler(Protocol):
    """What the region behind a server does with what arrives (implemented by ``node.RegionNode``)."""

    region: str

    def known(self, region: str) -> bool: ...
    def handle_push(self, msg: InMessage) -> PushResult: ...
    def handle_exchange(self, msg: InMessage) -> OutMessage: ...
    def handle_pull(self, requester: str, what: str, min_round: int) -> OutMessage: ...
    def handle_hello(self, req: sync_pb2.HelloRequest) -> PeerStatus: ...
    def handle_leave(self, sender: str) -> None: ...


# ---------------------------------------------------------------- framing


def frames(
    msg: OutMessage, src: str, dst: str, shaper: LinkShaper, stats: TransferStats
) -> Iterator[sync_pb2.Frame]:
    """The frames of ``msg`` on src -> dst: latency once, then each frame paced at the link rate."""
    shaper.propagate(src, dst)
    m = msg.meta
    header = sync_pb2.Header(
        sender=m.sender,
        stream=m.stream,
        round=m.round,
        weight=m.weight,
        version=m.version,
        seq=m.seq,
        base_seq=m.base_seq,
        fingerprint=m.fingerprint,
        step=m.step,
        step_s=m.step_s,
        opened_at=m.opened_at,
        sent_at=time.time(),
        chunks=sum(len(e.chunks) for _, e in msg.parts),
        parts=[sync_pb2.TensorSpec(name=n, numel=e.numel, codec=_CODEC_TO_PB[e.codec]) for n, e in msg.parts],
    )
    yield _paced(sync_pb2.Frame(header=header), src, dst, shaper, stats)
    for i, (_, enc) in enumerate(msg.parts):
        for c in enc.chunks:
            chunk = sync_pb2.Chunk(
                part=i,
                offset=c.offset,
                numel=c.numel,
                data=c.data,
                scales=c.scales,
                indices=c.indices,
                block=c.block,
            )
            yield _paced(sync_pb2.Frame(chunk=chunk), src, dst, shaper, stats)


def wire_bytes(message: object) -> int:
    """Bytes a protobuf message takes on a gRPC stream: its serialization and the length prefix.
    Every message of the sync service is counted this way, the unary calls and acks included."""
    return message.ByteSize() + _GRPC_PREFIX  # type: ignore[attr-defined]


def _paced(
    frame: sync_pb2.Frame, src: str, dst: str, shaper: LinkShaper, stats: TransferStats
) -> sync_pb2.Frame:
    n = wire_bytes(frame)
    shaper.pace(src, dst, n)
    stats.add_sent(dst, n)
    return frame


def _check_figures(h: sync_pb2.Header) -> None:
    """The balancing figures feed every region's split: a value no clock or step time can have is
    refused rather than planned on."""
    if not (math.isfinite(h.step_s) and 0.0 <= h.step_s <= MAX_STEP_S):
        raise InvalidArgument(
            f"header.step_s must be within [0, {MAX_STEP_S:.0f}] s, got {h.step_s}", field="header.step_s"
        )
    if not (math.isfinite(h.opened_at) and 0.0 <= h.opened_at <= MAX_WALL_CLOCK):
        raise InvalidArgument(
            f"header.opened_at must be a unix time, got {h.opened_at}", field="header.opened_at"
        )


# Chunk frames one message of a series may announce: far more than any tensor this job sends
# takes (a chunk is at least 1 KiB dense), and small enough that a header cannot make us wait on
# a count no peer could send.
MAX_CHUNKS = 1 << 24


class Assembler:
    """Rebuilds ``InMessage``s from frames, decoding each chunk as it arrives: one message per
    stream (``run``), or a series of them on one stream, each ended by its header's chunk count
    (``series``)."""

    def __init__(self, receiver: str, stats: TransferStats, shaper: LinkShaper) -> None:
        self.receiver, self.stats, self.shaper = receiver, stats, shaper

    def run(self, it: Iterable[sync_pb2.Frame], check_sender: object = None) -> InMessage:
        msg: _Building | None = None
        for frame in it:
            kind = frame.WhichOneof("kind")
            if msg is None:
                if kind != "header":
                    raise InvalidArgument(
                        "the first frame of a stream must be a header", field="frame.header"
                    )
                msg = _Building(frame.header, check_sender)
            elif kind == "chunk":
                msg.add(frame.chunk)
            else:
                raise InvalidArgument("a second header in one stream", field="frame.header")
            self._count(msg, frame)
        if msg is None:
            raise InvalidArgument("empty stream: no header", field="frame.header")
        return self._done(msg)

    def series(self, it: Iterable[sync_pb2.Frame], check_sender: object = None) -> Iterator[InMessage]:
        """Each message of a ``PushSeries`` stream as soon as its last chunk is in."""
        msg: _Building | None = None
        for frame in it:
            kind = frame.WhichOneof("kind")
            if msg is None:
                if kind != "header":
                    raise InvalidArgument(
                        "a message of a series must start with a header", field="frame.header"
                    )
                if not 0 <= frame.header.chunks <= MAX_CHUNKS:
                    raise InvalidArgument(
                        f"header.chunks must be within [0, {MAX_CHUNKS}], got {frame.header.chunks}",
                        field="header.chunks",
                    )
                msg = _Building(frame.header, check_sender)
            elif kind == "chunk":
                msg.add(frame.chunk)
            else:
                raise InvalidArgument(
                    f"a header after {msg.chunks} of the {msg.expected} chunks its message announced",
                    field="header.chunks",
                )
            self._count(msg, frame)
            if msg.chunks == msg.expected:
                yield self._done(msg)
                msg = None
        if msg is not None:
            raise InvalidArgument(
                f"the stream ended after {msg.chunks} of the {msg.expected} chunks its message announced",
                field="header.chunks",
            )

    def _count(self, msg: _Building, frame: sync_pb2.Frame) -> None:
        n = wire_bytes(frame)
        msg.msg.nbytes += n
        self.stats.add_recv(msg.msg.meta.sender, n)

    def _done(self, msg: _Building) -> InMessage:
        out = msg.msg
        seconds = time.time() - msg.sent_at
        self.stats.add_transfer(
            out.nbytes, seconds, self.shaper.rate_bytes_per_s(out.meta.sender, self.receiver)
        )
        return out


class _Building:
    """One message being rebuilt: its header checked, its chunks decoded as they come."""

    def __init__(self, h: sync_pb2.Header, check_sender: object) -> None:
        if callable(check_sender):
            check_sender(h.sender)
        _check_figures(h)
        self.msg = InMessage(
            Meta(
                h.sender,
                h.stream,
                h.round,
                h.weight,
                h.version,
                h.seq,
                h.base_seq,
                h.fingerprint,
                h.step,
                h.step_s,
                h.opened_at,
            )
        )
        self.codecs: list = []
        for spec in h.parts:
            if spec.codec not in _PB_TO_CODEC:
                raise InvalidArgument(f"part {spec.name!r}: unknown codec {spec.codec}", field="header.parts")
            if spec.numel < 0 or spec.numel > (1 << 34):
                raise InvalidArgument(f"part {spec.name!r}: bad numel {spec.numel}", field="header.parts")
            self.msg.tensors[spec.name] = _zeros(spec.numel)
            self.msg.encoded[spec.name] = EncodedTensor(_PB_TO_CODEC[spec.codec], spec.numel)
            self.codecs.append(get_codec(_PB_TO_CODEC[spec.codec]))
        self.names = [s.name for s in h.parts]
        self.sent_at = h.sent_at
        self.expected, self.chunks = h.chunks, 0

    def add(self, c: sync_pb2.Chunk) -> None:
        if not 0 <= c.part < len(self.codecs):
            raise InvalidArgument(f"chunk for part {c.part} of {len(self.codecs)}", field="chunk.part")
        enc = EncodedChunk(c.offset, c.numel, c.data, c.scales, c.indices, c.block)
        name = self.names[c.part]
        decode_chunk_into(self.codecs[c.part], enc, self.msg.tensors[name])
        self.msg.encoded[name].chunks.append(enc)
        self.chunks += 1


def _zeros(n: int):  # noqa: ANN202 - local helper
    import torch

    return torch.zeros(n, dtype=torch.float32)


# ---------------------------------------------------------------- server


class SyncServicer(sync_pb2_grpc.SyncServiceServicer):
    """Converts wire messages and delegates to the handler; domain errors become gRPC codes."""

    def __init__(self, handler: Handler, shaper: LinkShaper, stats: TransferStats) -> None:
        self.h, self.shaper, self.stats = handler, shaper, stats

    def _assembler(self) -> Assembler:
        return Assembler(self.h.region, self.stats, self.shaper)

    def _check_sender(self, sender: str) -> None:
        if not self.h.known(sender):
            from contracts.errors import NotFound

            raise NotFound(f"region {sender!r} is not part of this job", field="header.sender")

    def Push(self, request_iterator, context):  # noqa: N802, ANN001, ANN201
        try:
            msg = self._assembler().run(request_iterator, self._check_sender)
            r = self.h.handle_push(msg)
            ack = sync_pb2.PushAck(
                receiver=self.h.region, accepted=r.accepted, reason=r.reason, progress=r.progress
            )
            self.stats.add_sent(msg.meta.sender, wire_bytes(ack))
            return ack
        except CpnError as e:
            _abort(context, e)

    def PushSeries(self, request_iterator, context):  # noqa: N802, ANN001, ANN201
        try:
            sender, accepted, reason, progress = "", True, "", 0
            for msg in self._assembler().series(request_iterator, self._check_sender):
                r = self.h.handle_push(msg)
                sender, progress = msg.meta.sender, r.progress
                if accepted and not r.accepted:
                    accepted, reason = False, r.reason
            ack = sync_pb2.PushAck(
                receiver=self.h.region, accepted=accepted, reason=reason, progress=progress
            )
            if sender:
                self.stats.add_sent(sender, wire_bytes(ack))
            return ack
        except CpnError as e:
            _abort(context, e)

    def Exchange(self, request_iterator, context):  # noqa: N802, ANN001, ANN201
        try:
            msg = self._assembler().run(request_iterator, self._check_sender)
            reply = self.h.handle_exchange(msg)
        except CpnError as e:
            _abort(context, e)
        yield from frames(reply, self.h.region, msg.meta.sender, self.shaper, self.stats)

    def Pull(self, request, context):  # noqa: N802, ANN001, ANN201
        try:
            self._check_sender(request.requester)
            self.stats.add_recv(request.requester, wire_bytes(request))
            if not request.what:
                raise InvalidArgument("pull: 'what' is required", field="what")
            reply = self.h.handle_pull(request.requester, request.what, request.min_round)
        except CpnError as e:
            _abort(context, e)
        yield from frames(reply, self.h.region, request.requester, self.shaper, self.stats)

    def Hello(self, request, context):  # noqa: N802, ANN001, ANN201
        try:
            self._check_sender(request.sender)
            self.stats.add_recv(request.sender, wire_bytes(request))
            s = self.h.handle_hello(request)
        except CpnError as e:
            _abort(context, e)
        reply = sync_pb2.HelloResponse(
            responder=s.region,
            ready=s.ready,
            progress=s.progress,
            completed=s.completed,
            step=s.step,
            mode=s.mode,
            accepted=s.accepted,
            include_from=s.include_from,
        )
        self.stats.add_sent(request.sender, wire_bytes(reply))
        return reply

    def Leave(self, request, context):  # noqa: N802, ANN001, ANN201
        try:
            self._check_sender(request.sender)
            self.stats.add_recv(request.sender, wire_bytes(request))
            self.h.handle_leave(request.sender)
        except CpnError as e:
            _abort(context, e)
        reply = sync_pb2.LeaveResponse()
        self.stats.add_sent(request.sender, wire_bytes(reply))
        return reply


_STATUS = (
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
)


def _abort(context: grpc.ServicerContext, e: CpnError) -> None:
    code = next((c for cls, c in _STATUS if isinstance(e, cls)), grpc.StatusCode.INTERNAL)
    context.abort(code, e.message)


class SyncServer:
    """The region's gRPC server: SyncService plus health and reflection."""

    def __init__(
        self,
        handler: Handler,
        shaper: LinkShaper,
        stats: TransferStats,
        listen: str = "127.0.0.1:0",
        max_workers: int = 16,
        auth_secret: str | None = None,
        tls: SyncTls | None = None,
    ) -> None:
        interceptors = [ServerAuth(auth_secret)] if auth_secret else []
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=max_workers), options=_OPTIONS, interceptors=interceptors
        )
        sync_pb2_grpc.add_SyncServiceServicer_to_server(SyncServicer(handler, shaper, stats), self.server)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            (
                SERVICE_NAME,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ),
            self.server,
        )
        if tls is None:
            self.port = self.server.add_insecure_port(listen)
        else:
            self.port = self.server.add_secure_port(listen, tls.server_credentials())
        if self.port == 0:
            raise FailedPrecondition(f"cannot listen on {listen!r}", field="sync.listen")
        host = listen.rsplit(":", 1)[0]
        self.address = f"{host}:{self.port}"

    def start(self) -> None:
        self.server.start()
        for name in ("", SERVICE_NAME):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    def stop(self, grace: float = 1.0) -> None:
        self.health.enter_graceful_shutdown()
        self.server.stop(grace).wait(grace + 1)


# ---------------------------------------------------------------- client


class PeerClient:
    """Calls to one peer region. Every call has a deadline; failures raise ``PeerError``."""

    def __init__(
        self,
        src: str,
        dst: str,
        address: str,
        shaper: LinkShaper,
        stats: TransferStats,
        auth_secret: str | None = None,
        tls: SyncTls | None = None,
    ) -> None:
        self.src, self.dst, self.shaper, self.stats = src, dst, shaper, stats
        self.auth_secret = auth_secret
        self.tls = tls
        self._lock = threading.Lock()
        self.address = ""
        self._channel: grpc.Channel | None = None
        self.set_address(address)

    def set_address(self, address: str) -> None:
        with self._lock:
            if address == self.address:
                return
            if self._channel is not None:
                self._channel.close()
            self.address = address
            if self.tls is None:
                self._channel = grpc.insecure_channel(address, options=_OPTIONS)
            else:
                self._channel = grpc.secure_channel(
                    address, self.tls.channel_credentials(), options=[*_OPTIONS, *self.tls.channel_options()]
                )
            channel = self._channel
            if self.auth_secret:
                channel = grpc.intercept_channel(channel, ClientAuth(self.auth_secret, self.src))
            self.stub = sync_pb2_grpc.SyncServiceStub(channel)

    def close(self) -> None:
        with self._lock:
            if self._channel is not None:
                self._channel.close()
                self._channel = None

    def _call(self, fn, *args, timeout: float):  # noqa: ANN001, ANN202
        try:
            return fn(*args, timeout=timeout)
        except grpc.RpcError as e:
            raise PeerError(self.dst, e.code().name, e.details() or "") from None

    def push(self, msg: OutMessage, timeout: float) -> PushResult:
        ack = self._call(
            self.stub.Push, frames(msg, self.src, self.dst, self.shaper, self.stats), timeout=timeout
        )
        self.stats.add_recv(self.dst, wire_bytes(ack))
        self.shaper.propagate(self.dst, self.src)  # the ack's way back
        return PushResult(ack.accepted, ack.reason, ack.progress)

    def push_series(self, queue: SimpleQueue[OutMessage | None], timeout: float) -> Future:
        """Start one ``PushSeries`` call that sends the messages put on ``queue``, in order, until
        it takes None; the future holds the peer's one ``PushResult`` or raises ``PeerError``.
        One call, so one stream and one request thread, for all the messages."""
        out: Future = Future()

        def sent() -> Iterator[sync_pb2.Frame]:
            while (msg := queue.get()) is not None:
                yield from frames(msg, self.src, self.dst, self.shaper, self.stats)

        def done(call: grpc.Future) -> None:
            try:
                ack = call.result()
            except grpc.RpcError as e:
                out.set_exception(PeerError(self.dst, e.code().name, e.details() or ""))
                return
            except Exception as e:  # noqa: BLE001 - cancelled: the caller sees it as a failed push
                out.set_exception(PeerError(self.dst, "CANCELLED", str(e)))
                return
            self.stats.add_recv(self.dst, wire_bytes(ack))
            self.shaper.propagate(self.dst, self.src)
            out.set_result(PushResult(ack.accepted, ack.reason, ack.progress))

        try:
            call = self.stub.PushSeries.future(sent(), timeout=timeout)
        except grpc.RpcError as e:
            raise PeerError(self.dst, e.code().name, e.details() or "") from None
        call.add_done_callback(done)
        return out

    def exchange(self, msg: OutMessage, timeout: float) -> InMessage:
        def run() -> InMessage:
            replies = self.stub.Exchange(
                frames(msg, self.src, self.dst, self.shaper, self.stats), timeout=timeout
            )
            return Assembler(self.src, self.stats, self.shaper).run(replies)

        return self._call(lambda timeout: run(), timeout=timeout)

    def pull(self, what: str, min_round: int, timeout: float) -> InMessage:
        def run() -> InMessage:
            self.shaper.propagate(self.src, self.dst)
            req = sync_pb2.PullRequest(requester=self.src, what=what, min_round=min_round)
            self.stats.add_sent(self.dst, wire_bytes(req))
            return Assembler(self.src, self.stats, self.shaper).run(self.stub.Pull(req, timeout=timeout))

        return self._call(lambda timeout: run(), timeout=timeout)

    def hello(self, req: sync_pb2.HelloRequest, timeout: float, wait_for_ready: bool = False) -> PeerStatus:
        self.shaper.propagate(self.src, self.dst)
        try:
            r = self.stub.Hello(req, timeout=timeout, wait_for_ready=wait_for_ready)
        except grpc.RpcError as e:
            raise PeerError(self.dst, e.code().name, e.details() or "") from None
        self.stats.add_sent(self.dst, wire_bytes(req))  # counted once the call went through
        self.stats.add_recv(self.dst, wire_bytes(r))
        self.shaper.propagate(self.dst, self.src)
        return PeerStatus(
            r.responder, r.ready, r.progress, r.completed, r.step, r.mode, r.accepted, r.include_from
        )

    def leave(self, reason: str, timeout: float) -> None:
        req = sync_pb2.LeaveRequest(sender=self.src, reason=reason)
        reply = self._call(self.stub.Leave, req, timeout=timeout)
        self.stats.add_sent(self.dst, wire_bytes(req))
        self.stats.add_recv(self.dst, wire_bytes(reply))
