"""Link probes on the agent: the LinkProbeService it serves, and the prober it runs on orders.

The control plane orders node A to probe node B. A sends B a few echoes (the lowest round trip is
the link's RTT) and then streams ``bulk_bytes`` to B; B times the bytes from the first chunk's
arrival to the last one's, so connection set-up and the first round trip stay out of the rate.
Every call carries a ticket signed with B's probe key: nobody but the control plane can make B
receive anything, and never more than the ticket says.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Callable

import grpc

from contracts.errors import CpnError, InvalidArgument, Unauthenticated
from contracts.link_probe import CHUNK_BYTES, MAX_TICKET_TTL_S, Ticket, verify
from proto.cpn.agent.v1 import agent_pb2, agent_pb2_grpc

log = logging.getLogger(__name__)

# gRPC refuses bigger messages before we see them: a chunk plus its ticket.
MAX_MESSAGE_BYTES = CHUNK_BYTES + 4096
MAX_CONCURRENT_CALLS = 4  # a probe is one call at a time; a few spare for a retry in flight
_FIRST_CHUNK_TIMEOUT_S = 10.0


def ticket_from_proto(t: agent_pb2.LinkProbeTicket) -> Ticket:
    return Ticket(t.probe_id, t.target_node_id, t.bulk_bytes, t.echoes, t.expires_at, t.mac)


def _status(exc: CpnError) -> grpc.StatusCode:
    if isinstance(exc, Unauthenticated):
        return grpc.StatusCode.UNAUTHENTICATED
    if isinstance(exc, InvalidArgument):
        return grpc.StatusCode.INVALID_ARGUMENT
    return grpc.StatusCode.FAILED_PRECONDITION


class ProbeServicer(agent_pb2_grpc.LinkProbeServiceServicer):
    """``identity`` gives (node_id, probe_key) once the node is registered, else None."""

    def __init__(self, identity: Callable[[], tuple[str, str] | None]) -> None:
        self._identity = identity
        self._echoes: dict[str, tuple[int, float]] = {}  # probe_id -> (echoes answered, expires_at)
        self._bulk_used: dict[str, float] = {}  # probe_id -> expires_at: one bulk transfer per ticket

    def _check(self, t: agent_pb2.LinkProbeTicket) -> Ticket:
        ident = self._identity()
        if ident is None:
            raise Unauthenticated("this node is not registered yet")
        now = time.time()
        ticket = ticket_from_proto(t)
        verify(ident[1], ident[0], ticket, now)
        # Forget tickets once expired (they can no longer be replayed): memory stays bounded.
        for pid in [p for p, (_, exp) in self._echoes.items() if exp <= now]:
            del self._echoes[pid]
        for pid in [p for p, exp in self._bulk_used.items() if exp <= now]:
            del self._bulk_used[pid]
        return ticket

    async def Echo(
        self, request: agent_pb2.LinkProbeEcho, context: grpc.aio.ServicerContext
    ) -> agent_pb2.LinkProbeEcho:
        try:
            ticket = self._check(request.ticket)
            count, _ = self._echoes.get(ticket.probe_id, (0, ticket.expires_at))
            if count >= ticket.echoes:
                raise Unauthenticated(f"probe ticket allows {ticket.echoes} echoes, all used")
            self._echoes[ticket.probe_id] = (count + 1, ticket.expires_at)
        except CpnError as exc:
            await context.abort(_status(exc), exc.message)
        return agent_pb2.LinkProbeEcho(seq=request.seq)

    async def Bulk(
        self, request_iterator: AsyncIterator[agent_pb2.LinkProbeChunk], context: grpc.aio.ServicerContext
    ) -> agent_pb2.LinkProbeBulkReply:
        try:
            first = await asyncio.wait_for(anext(request_iterator), _FIRST_CHUNK_TIMEOUT_S)
        except (StopAsyncIteration, TimeoutError):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bulk: no first chunk with a ticket")
        t0 = time.perf_counter()
        try:
            ticket = self._check(first.ticket)
            if ticket.probe_id in self._bulk_used:
                raise Unauthenticated("probe ticket already used for a bulk transfer")
            self._bulk_used[ticket.probe_id] = ticket.expires_at
        except CpnError as exc:
            await context.abort(_status(exc), exc.message)
        total, last = len(first.data), t0
        async for chunk in request_iterator:
            total += len(chunk.data)
            if total > ticket.bulk_bytes:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"bulk: more than the ticket's {ticket.bulk_bytes} bytes",
                )
            if time.time() > ticket.expires_at:
                await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "bulk: ticket expired mid-transfer")
            last = time.perf_counter()
        return agent_pb2.LinkProbeBulkReply(
            bytes=total, timed_bytes=total - len(first.data), span_s=last - t0
        )


def build_probe_server(
    identity: Callable[[], tuple[str, str] | None],
    host: str,
    port: int,
) -> tuple[grpc.aio.Server, int]:
    """A bound, not yet started probe server and its port (``port=0`` picks a free one)."""
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", 4096),
        ],
        maximum_concurrent_rpcs=MAX_CONCURRENT_CALLS,
    )
    agent_pb2_grpc.add_LinkProbeServiceServicer_to_server(ProbeServicer(identity), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"probe server could not bind {host}:{port}")
    return server, bound


async def run_probe(order: agent_pb2.LinkProbeOrder) -> agent_pb2.LinkProbeResult:
    """Carry out one order; failures come back as a result with ``error`` set, never raised."""
    ticket = order.ticket
    started = time.perf_counter()
    result = agent_pb2.LinkProbeResult(probe_id=ticket.probe_id)
    budget = min(MAX_TICKET_TTL_S, ticket.expires_at - time.time())
    if budget <= 0:
        result.error = "the order's ticket expired before the probe started"
        return result
    host = order.target_host
    target = (
        f"[{host}]:{order.target_port}"
        if ":" in host and not host.startswith("[")
        else f"{host}:{order.target_port}"
    )
    channel = grpc.aio.insecure_channel(target, options=[("grpc.max_send_message_length", MAX_MESSAGE_BYTES)])
    try:
        stub = agent_pb2_grpc.LinkProbeServiceStub(channel)
        deadline = time.monotonic() + budget
        rtts = []
        for seq in range(ticket.echoes):
            t = time.perf_counter()
            await stub.Echo(
                agent_pb2.LinkProbeEcho(ticket=ticket, seq=seq), timeout=deadline - time.monotonic()
            )
            rtts.append(time.perf_counter() - t)
        payload = os.urandom(CHUNK_BYTES)  # incompressible, sent again and again

        async def chunks() -> AsyncIterator[agent_pb2.LinkProbeChunk]:
            sent = 0
            while sent < ticket.bulk_bytes:
                n = min(CHUNK_BYTES, ticket.bulk_bytes - sent)
                yield agent_pb2.LinkProbeChunk(ticket=ticket if sent == 0 else None, data=payload[:n])
                sent += n

        reply = await stub.Bulk(chunks(), timeout=deadline - time.monotonic())
        result.rtt_ms = min(rtts) * 1000
        result.bulk_bytes = reply.timed_bytes
        result.bulk_s = reply.span_s
        if reply.bytes != ticket.bulk_bytes or reply.span_s <= 0:
            result.error = f"target saw {reply.bytes} of {ticket.bulk_bytes} bytes over {reply.span_s:.6f}s"
    except grpc.aio.AioRpcError as exc:
        result.error = f"{target}: {exc.code().name} {exc.details()}"[:500]
    finally:
        await channel.close(grace=None)
    result.duration_s = time.perf_counter() - started
    return result
