"""cpn.agent.v1 AgentService: converts wire messages and delegates to the domain; nothing else.

One ``Connect`` stream per node. Two tasks feed one outbox the stream drains: a reader handling
what the agent sends (heartbeats, inventory, task status, metrics, logs) and a forwarder relaying
the node's bus channel (assignments, cancels, drain orders). A second stream for the same node
supersedes the first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any

import grpc
from cryptography import x509
from sqlalchemy.exc import IntegrityError

from contracts.errors import CpnError, FailedPrecondition, InvalidArgument, PermissionDenied
from contracts.node_staging import StagingProbe
from contracts.registration import NodeRegistration, ProfileReport, probe_ages_problem
from contracts.states import TASK_TERMINAL
from orchestration.context import ServerContext
from orchestration.db.base import utcnow
from proto.cpn.agent.v1 import agent_pb2, agent_pb2_grpc
from proto.cpn.agent.v1.devices import device_from_proto
from resource_layer import link_probes, node_staging, registry
from resource_layer.convert import (
    gpu_report_from_heartbeat,
    metrics_to_dict,
    profile_report_from_proto,
    registration_from_proto,
    result_from_json,
    server_message_from_dict,
    staging_probe_from_proto,
    task_state_name,
)
from resource_layer.grpc_errors import abort_with
from resource_layer.handlers import ControlHandlers
from resource_layer.liveness import HeartbeatRows, LivenessBatcher
from resource_layer.log_batcher import TaskLogBatcher
from resource_layer.node_admin import REVOKED_MESSAGE_KIND
from resource_layer.tls import AgentTls, peer_common_name

log = logging.getLogger(__name__)


def node_channel(node_id: str) -> str:
    return f"node.{node_id}"


def probe_instants(hb: agent_pb2.Heartbeat) -> tuple[datetime, ...]:
    """When the probes behind a heartbeat's contention figure ran, by this server's clock (the
    agent sends their ages, so the two clocks need not agree); none where the ages are not a
    window (``probe_ages_problem``): the figure is then stored without a busy count."""
    ages = list(hb.cpu_contention_probe_ages_s)
    if not hb.cpu_contention or not ages or probe_ages_problem(ages) is not None:
        return ()
    now = utcnow()
    return tuple(now - timedelta(seconds=a) for a in ages)


class _End:
    """Outbox sentinel: the stream should end (``status`` set when it must end in error)."""

    def __init__(self, why: str, status: grpc.StatusCode | None = None) -> None:
        self.why, self.status = why, status


class AgentServicer(agent_pb2_grpc.AgentServiceServicer):
    def __init__(
        self,
        ctx: ServerContext,
        handlers: ControlHandlers,
        *,
        heartbeat_db_every_s: float | None = None,
        hello_timeout_s: float = 10.0,
        tls: AgentTls | None = None,
        enrollment_only: bool = False,
    ) -> None:
        self._ctx = ctx
        self._tls = tls
        # The enrollment port (mTLS deployments): Register only, for nodes without a certificate yet.
        self._enrollment_only = enrollment_only
        self._handlers = handlers
        # last_heartbeat_at is written at most this often; the reaper trusts it for a node whose
        # liveness key it cannot see (a restarted in-process bus), so keep it well inside the TTL.
        settings = ctx.settings
        self._heartbeat_db_every_s = (
            heartbeat_db_every_s
            if heartbeat_db_every_s is not None
            else max(settings.heartbeat_interval_s, settings.node_lost_after_s / 2)
        )
        self._hello_timeout_s = hello_timeout_s
        self._streams: dict[str, asyncio.Queue[Any]] = {}  # node_id -> outbox of its live stream
        # a heartbeat counts as ingested once its node's liveness key is refreshed
        self._liveness = LivenessBatcher(
            ctx.bus, settings.node_lost_after_s, on_flushed=ctx.metrics.heartbeats.inc
        )
        self._rows = HeartbeatRows(
            lambda heard, probed, gpus: registry.persist_heartbeats(ctx, heard, probed, gpus)
        )
        self.logs = TaskLogBatcher(ctx)

    # -- Register -------------------------------------------------------------------------------
    async def Register(
        self, request: agent_pb2.RegisterRequest, context: grpc.aio.ServicerContext
    ) -> agent_pb2.RegisterResponse:
        certificate = b""
        try:
            csr = self._check_csr(request, context)
            node_id, token, cluster_id, probe_key = await asyncio.to_thread(
                self._register, registration_from_proto(request), context.peer() or ""
            )
            if csr is not None:
                assert self._tls is not None
                certificate = await asyncio.to_thread(self._tls.issue_node_certificate, csr, node_id)
        except CpnError as exc:
            await abort_with(context, exc)
        except Exception:
            log.exception("registration from %s/%s failed", request.region, request.cluster)
            await context.abort(grpc.StatusCode.INTERNAL, "registration failed on the server; retry later")
        log.info("node %s registered in %s/%s", node_id, request.region, request.cluster)
        return agent_pb2.RegisterResponse(
            node_id=node_id,
            node_token=token,
            cluster_id=cluster_id,
            heartbeat_interval_s=self._ctx.settings.heartbeat_interval_s,
            probe_key=probe_key,
            node_certificate_pem=certificate.decode(),
            store_probe=await asyncio.to_thread(self._store_probe),
        )

    def _store_probe(self) -> agent_pb2.StoreProbe | None:
        """The store probe's signed URLs; None (and the node measures nothing) where the store
        cannot keep its blobs now: the registration does not fail for it."""
        try:
            urls = node_staging.probe_urls(self._ctx.artifacts, self._ctx.settings, time.time())
        except Exception:
            log.warning("no store probe offered: the artifact store refused its blobs", exc_info=True)
            return None
        return agent_pb2.StoreProbe(
            blobs=[agent_pb2.StoreProbeBlob(url=u, digest=d, bytes=n) for u, d, n in urls]
        )

    def _check_csr(
        self, request: agent_pb2.RegisterRequest, context: grpc.aio.ServicerContext
    ) -> x509.CertificateSigningRequest | None:
        """Refuse, before anything is written, a CSR this control plane cannot sign and a
        re-registration whose client certificate names another node."""
        if self._tls is not None and self._tls.mutual and not self._enrollment_only and request.node_id:
            named = peer_common_name(context)
            if named != request.node_id:
                raise PermissionDenied(
                    f"node_id: the client certificate is for node {named!r}", field="node_id"
                )
        if not request.csr_pem:
            return None
        if self._tls is None:
            raise FailedPrecondition("csr_pem: this control plane runs without TLS", field="csr_pem")
        return self._tls.check_can_issue(request.csr_pem.encode())

    def _register(self, reg: NodeRegistration, peer: str) -> tuple[str, str, str, str]:
        for attempt in range(3):
            try:
                with self._ctx.session_factory() as session, session.begin():
                    node, token = registry.register_node(session, reg, source=peer)
                    return node.id, token, node.cluster_id, node.probe_key
            except IntegrityError:
                # Two first nodes of one new region or cluster raced to create it; the loser's
                # transaction rolled back whole (token use included) and now finds the rows.
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    # -- Connect --------------------------------------------------------------------------------
    async def Connect(
        self, request_iterator: AsyncIterator[agent_pb2.AgentMessage], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[agent_pb2.ServerMessage]:
        if self._enrollment_only:
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "this is the enrollment port: connect to the agent port with the node's certificate",
            )
        hello = await self._read_hello(request_iterator, context)
        node_id = hello.node_id
        if self._tls is not None and self._tls.mutual and peer_common_name(context) != node_id:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"the client certificate is for node {peer_common_name(context)!r}, not {node_id!r}",
            )
        outbox: asyncio.Queue[Any] = asyncio.Queue()
        previous = self._streams.get(node_id)
        if previous is not None:
            previous.put_nowait(_End("superseded by a newer stream from the same node"))
        self._streams[node_id] = outbox
        tasks: list[asyncio.Task[None]] = []
        try:
            async with contextlib.AsyncExitStack() as stack:
                try:
                    subscription = await stack.enter_async_context(
                        self._ctx.bus.subscribe(node_channel(node_id))
                    )
                except Exception as exc:  # the bus (Redis) did not answer: the agent reconnects
                    log.warning("subscribing the stream of node %s failed: %s", node_id, exc)
                    await context.abort(
                        grpc.StatusCode.UNAVAILABLE, "the control plane's bus did not answer; retry"
                    )
                # Subscribed first, then read what is pending: an assignment dispatched in between
                # arrives twice rather than never, and the agent ignores ids it already has. The
                # node reads as alive only from here on, when it can be sent work.
                try:
                    status = await asyncio.to_thread(registry.mark_connected, self._ctx, node_id)
                    pending = await asyncio.to_thread(self._handlers.pending_assignments, self._ctx, node_id)
                except CpnError as exc:
                    await abort_with(context, exc)
                except Exception:
                    log.exception("accepting the stream of node %s failed", node_id)
                    await context.abort(
                        grpc.StatusCode.UNAVAILABLE, "server could not accept the stream; retry"
                    )
                yield agent_pb2.ServerMessage(
                    ack=agent_pb2.Ack(
                        node_id=node_id, heartbeat_interval_s=self._ctx.settings.heartbeat_interval_s
                    )
                )
                if status == "drained":  # a drained node stays drained across its agent's restarts
                    yield agent_pb2.ServerMessage(drain=agent_pb2.Drain(reason="node is drained"))
                running = set(hello.running_assignments)
                for message in pending:
                    wrapped = message if "assignment" in message else {"assignment": message}
                    if wrapped["assignment"].get("assignment_id") in running:
                        continue
                    try:
                        yield server_message_from_dict(wrapped)
                    except CpnError as exc:
                        log.error(
                            "not re-sending a malformed assignment to node %s: %s", node_id, exc.message
                        )
                tasks.append(asyncio.create_task(self._read(node_id, request_iterator, outbox)))
                tasks.append(asyncio.create_task(self._forward(node_id, subscription, outbox)))
                log.info("node %s connected (running %d assignments)", node_id, len(running))
                while True:
                    item = await outbox.get()
                    if isinstance(item, _End):
                        log.info("node %s stream ends: %s", node_id, item.why)
                        if item.status is not None:
                            await context.abort(item.status, item.why)
                        return
                    yield item
        finally:
            for task in tasks:
                task.cancel()
            if self._streams.get(node_id) is outbox:
                del self._streams[node_id]
            # The node's last lines are written now, not lost with a server that is stopping
            # (shielded: a second cancellation leaves the write running on the loop).
            await asyncio.shield(self.logs.flush())

    async def _read_hello(
        self, request_iterator: AsyncIterator[agent_pb2.AgentMessage], context: grpc.aio.ServicerContext
    ) -> agent_pb2.Hello:
        try:
            first = await asyncio.wait_for(anext(request_iterator), self._hello_timeout_s)
        except StopAsyncIteration:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "stream closed before Hello")
        except TimeoutError:
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"no Hello within {self._hello_timeout_s:.0f}s of connecting",
            )
        if first.WhichOneof("kind") != "hello":
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"first message must be a Hello, got {first.WhichOneof('kind')}",
            )
        try:
            await asyncio.to_thread(self._authenticate, first.hello.node_id, first.hello.node_token)
        except CpnError as exc:
            await abort_with(context, exc)
        return first.hello

    def _authenticate(self, node_id: str, node_token: str) -> None:
        with self._ctx.session_factory() as session:
            registry.authenticate_node(session, node_id, node_token)

    async def _forward(
        self, node_id: str, subscription: AsyncIterator[Any], outbox: asyncio.Queue[Any]
    ) -> None:
        try:
            async for _channel, message in subscription:
                if REVOKED_MESSAGE_KIND in message:  # an operator revoked the node: end it now
                    why = f"node {node_id} is revoked: {message[REVOKED_MESSAGE_KIND].get('reason', '')}"
                    outbox.put_nowait(_End(why, grpc.StatusCode.PERMISSION_DENIED))
                    return
                try:
                    outbox.put_nowait(server_message_from_dict(message))
                except CpnError as exc:
                    log.error("dropping malformed message for node %s: %s", node_id, exc.message)
        except Exception:
            log.exception("bus subscription for node %s failed", node_id)
            outbox.put_nowait(_End("bus subscription failed; reconnect", grpc.StatusCode.UNAVAILABLE))

    async def _read(
        self,
        node_id: str,
        request_iterator: AsyncIterator[agent_pb2.AgentMessage],
        outbox: asyncio.Queue[Any],
    ) -> None:
        # mark_connected just wrote the row; the first heartbeat is stored all the same, so the
        # host's CPU contention is known to quotes made right after the node connects.
        last_persist: float | None = None
        try:
            async for message in request_iterator:
                kind = message.WhichOneof("kind")
                if kind == "heartbeat":
                    self._liveness.touch(node_id)
                    if last_persist is None or time.monotonic() - last_persist >= self._heartbeat_db_every_s:
                        hb = message.heartbeat
                        gpus, problems = gpu_report_from_heartbeat(hb)
                        if problems:
                            log.warning("node %s heartbeat: left out %s", node_id, "; ".join(problems[:4]))
                        # 0: not measured
                        self._rows.note(node_id, hb.cpu_contention or None, probe_instants(hb), gpus)
                        last_persist = time.monotonic()
                    continue
                try:
                    await self._handle(node_id, kind, message)
                except CpnError as exc:
                    # One bad message (e.g. status for a task this node no longer runs) must not
                    # cut the node off; the control layer has already decided what it means.
                    log.warning("node %s %s refused: %s", node_id, kind, exc.message)
            outbox.put_nowait(_End("agent closed the stream"))
        except grpc.aio.AioRpcError:
            outbox.put_nowait(_End("agent went away"))
        except asyncio.CancelledError:
            raise
        except Exception:
            # Most likely the database: end the stream so the agent reconnects and re-sends its
            # tasks' final states, rather than losing them here.
            log.exception("handling a message from node %s failed", node_id)
            outbox.put_nowait(
                _End("server failed to handle a message; reconnect", grpc.StatusCode.UNAVAILABLE)
            )

    async def _handle(self, node_id: str, kind: str | None, message: agent_pb2.AgentMessage) -> None:
        ctx = self._ctx
        if kind == "task_status":
            s = message.task_status
            state = task_state_name(s.state)
            if state in TASK_TERMINAL:
                # The task's last lines are stored before its end is: a follower that sees the job
                # end then reads them all.
                await self.logs.flush()
            await asyncio.to_thread(
                self._handlers.on_task_status,
                ctx,
                node_id,
                s.assignment_id,
                state,
                s.message,
                s.exit_code,
                result_from_json(s.result_json),
                s.lost,
            )
        elif kind == "metrics":
            m = message.metrics
            await asyncio.to_thread(
                self._handlers.on_task_metrics, ctx, node_id, m.assignment_id, metrics_to_dict(m)
            )
        elif kind == "log":
            entry = message.log
            self.logs.add(node_id, entry.assignment_id, entry.stream, entry.line)
        elif kind == "inventory":
            devices = [device_from_proto(d) for d in message.inventory.devices]
            await asyncio.to_thread(self._update_inventory, node_id, devices)
        elif kind == "capacity":
            c = message.capacity
            await asyncio.to_thread(self._update_capacity, node_id, c.devices_unavailable, c.queue_wait_s)
        elif kind == "probe_result":
            r = message.probe_result
            result = {
                "probe_id": r.probe_id,
                "rtt_ms": r.rtt_ms,
                "bulk_bytes": r.bulk_bytes,
                "bulk_s": r.bulk_s,
                "duration_s": r.duration_s,
                "error": r.error,
            }
            await asyncio.to_thread(self._record_probe, node_id, result)
        elif kind == "checkpoint_copy_result":
            c = message.checkpoint_copy_result
            result = {
                "transfer_id": c.transfer_id,
                "bytes": c.bytes,
                "duration_s": c.duration_s,
                "error": c.error,
                "assignment_id": c.assignment_id,
            }
            await asyncio.to_thread(self._handlers.on_checkpoint_copy_result, ctx, node_id, result)
        elif kind == "staging_probe":
            await asyncio.to_thread(
                self._record_staging_probe, node_id, staging_probe_from_proto(message.staging_probe)
            )
        elif kind == "profile":
            await asyncio.to_thread(self._record_profile, node_id, profile_report_from_proto(message.profile))
        elif kind == "cache":
            c = message.cache
            await asyncio.to_thread(self._replace_cache, node_id, list(c.blobs), list(c.venvs))
        elif kind == "hello":
            raise InvalidArgument("hello: only the first message of a stream may be a Hello")
        else:
            raise InvalidArgument(f"unknown agent message kind {kind!r}")

    def _record_probe(self, node_id: str, result: dict[str, Any]) -> None:
        with self._ctx.session_factory() as session, session.begin():
            row = link_probes.record_result(session, node_id, result)
        log.info("link probe %s %s->%s: %s", row.id, row.src_region, row.dst_region, row.error or "ok")

    def _record_staging_probe(self, node_id: str, probe: StagingProbe) -> None:
        with self._ctx.session_factory() as session, session.begin():
            node_staging.record_probe(session, node_id, probe)
        log.info("node %s staging probe: %s", node_id, probe.as_dict())

    def _record_profile(self, node_id: str, report: ProfileReport) -> None:
        with self._ctx.session_factory() as session, session.begin():
            registry.record_profile(session, node_id, report)
        log.info("node %s profile arrived: placeable from now on", node_id)

    def _replace_cache(self, node_id: str, blobs: list[str], venvs: list[str]) -> None:
        with self._ctx.session_factory() as session, session.begin():
            node_staging.replace_cache(session, node_id, blobs, venvs)

    def _update_capacity(self, node_id: str, devices_unavailable: int, queue_wait_s: float) -> None:
        with self._ctx.session_factory() as session, session.begin():
            registry.update_capacity(session, node_id, devices_unavailable, queue_wait_s)

    def _update_inventory(self, node_id: str, devices: list[Any]) -> None:
        with self._ctx.session_factory() as session, session.begin():
            registry.update_inventory(session, node_id, devices)
