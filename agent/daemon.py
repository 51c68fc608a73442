"""The node daemon: register, hold the stream, run assignments, reconnect, stop cleanly.

Life of an agent process:
1. stop worker groups a previous agent process left behind (from the state file);
2. find the devices and probe the sandbox;
3. register (with stored node credentials when they fit, else with the enrollment token) at once,
   saying that the profile follows: the node is listed "measuring" and not placed, while its
   reference step (and the venv build timed in the same turn of the host) runs beside the stream;
   the profile goes up when it is measured (again on each new stream), then the store probe;
4. hold one ``Connect`` stream; when it breaks, reconnect with exponential backoff capped below
   the server's loss threshold, keeping the workers running (nothing in a worker depends on the
   stream) and naming them in the next Hello, then replaying each task's state and latest metrics;
5. on SIGTERM/SIGINT stop the workers (reported FAILED, so the control plane re-places them),
   let the last messages go up, and exit 0. A signal during start-up ends it there: a reference
   step under way is stopped and none is started after it.

An agent that dies by any signal, SIGKILL included, leaves no process behind: its workers, its
reference step and its pip builds run under keepers (``contracts.lifetime``), the sandbox probe
under bwrap's ``--die-with-parent``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
import signal
import threading
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import grpc

from agent import cleanup, contention, staging_probe
from agent.backends import cluster_capacity, find_devices, make_launcher
from agent.checkpoint_transfer import (
    JobCredentials,
    build_checkpoint_server,
    run_copy,
    ticket_from_proto,
    tls_from_proto,
)
from agent.duties import Duty, run_duty
from agent.fetch import Cancelled
from agent.gpu_watch import GpuWatch
from agent.outbox import Outbox
from agent.probe import build_probe_server, run_probe
from agent.profile import another_measuring, measure_profile, one_reference_at_a_time
from agent.sandbox import SandboxProbe, needs_sandbox, probe_sandbox
from agent.settings import AgentSettings
from agent.slurm import cancel_leftover_job
from agent.slurm_queue import coarse_wait_s
from agent.state import AgentState, Credentials
from agent.tls import certificate_request, channel_credentials, load_or_create_key, read_pem
from agent.workers import FAILED, Assignment, WorkerRun, stop_leftover
from contracts.checkpoint_transfer import CheckpointTls
from contracts.errors import InvalidArgument
from contracts.node_staging import StagingProbe
from contracts.registration import DeviceReport, NodeProfile
from proto.cpn.agent.v1 import agent_pb2, agent_pb2_grpc
from proto.cpn.agent.v1.devices import device_to_proto, sample_to_proto
from proto.cpn.agent.v1.profile import profile_to_proto

log = logging.getLogger(__name__)

AGENT_VERSION = "0.1.0"
# Registration refusals an agent cannot fix by retrying: an operator must change something.
FATAL_REGISTER_CODES = (
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.PERMISSION_DENIED,
)


class AgentFatal(Exception):
    """The agent cannot go on (e.g. its registration was refused)."""


class _Reregister(Exception):
    """The server no longer knows this node's credentials: register again."""


DEFAULT_HEARTBEAT_S = 2.0  # until the server says otherwise (the server's default too)
MAX_PREEMPT_GRACE_S = 3600.0  # the longest a preemption order may give workers to checkpoint
CACHE_REPORT_EVERY_S = 10.0  # the cache is looked at this often (and after each staging)


def reconnect_cap_s(settings: AgentSettings, heartbeat_interval_s: float) -> float:
    """The longest wait between reconnect attempts: never more than one heartbeat interval.

    The server declares a node lost after interval x misses (misses >= 1) without a heartbeat, and
    a restarted server waits a grace of a few thresholds before judging anyone; an agent that
    retried less often than once an interval could miss either window while its workers run fine.
    """
    return max(settings.reconnect_min_s, min(settings.reconnect_max_s, heartbeat_interval_s))


def channel_options(settings: AgentSettings, cap_s: float | None = None) -> list[tuple[str, int]]:
    backoff_ms = int(settings.reconnect_min_s * 1000)
    cap_ms = int((cap_s if cap_s is not None else settings.reconnect_max_s) * 1000)
    return [
        ("grpc.keepalive_time_ms", 20_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
        # The channel's own reconnect backoff (default up to 120 s) must not outlast ours: while it
        # waits, every call fails at once without trying the server.
        ("grpc.initial_reconnect_backoff_ms", backoff_ms),
        ("grpc.min_reconnect_backoff_ms", backoff_ms),
        ("grpc.max_reconnect_backoff_ms", max(backoff_ms, cap_ms)),
    ]


def make_channel(
    settings: AgentSettings,
    target: str,
    options: list[tuple[str, int]],
    client: tuple[bytes, bytes] | None = None,
) -> grpc.aio.Channel:
    """Plaintext without a CA; else TLS verifying the server, presenting ``client`` (key, cert) if given."""
    if settings.tls_ca_file is None:
        return grpc.aio.insecure_channel(target, options=options)
    ca = read_pem(settings.tls_ca_file, "--tls-ca-file")
    credentials = channel_credentials(ca, *client) if client else channel_credentials(ca)
    extra: list[tuple[str, Any]] = []
    if settings.tls_server_name:
        extra.append(("grpc.ssl_target_name_override", settings.tls_server_name))
    return grpc.aio.secure_channel(target, credentials, options=[*options, *extra])


class _Session:
    def __init__(self) -> None:
        self.active = True
        self.acked = asyncio.Event()


class Agent:
    def __init__(self, settings: AgentSettings, devices: list[DeviceReport] | None = None) -> None:
        self.settings = settings
        self.devices = devices
        self._launcher = make_launcher(settings)  # where tasks run: this node, or its cluster's Slurm
        self.profile: NodeProfile | None = None
        self._contention = contention.Contention()
        self._own_exited_at = -math.inf  # monotonic: when the last forgotten run's workers exited
        self.heartbeat_interval_s = DEFAULT_HEARTBEAT_S
        self._outbox = Outbox()
        self._runs: dict[str, WorkerRun] = {}  # live and recently finished, by assignment id
        self._finals: dict[str, tuple[agent_pb2.AgentMessage, float]] = {}  # finished runs we no longer hold
        self._run_tasks: set[asyncio.Task[None]] = set()
        self._state = AgentState()
        self._connected = False
        self._draining = False
        self._seq = 0
        self._stop: asyncio.Event | None = None
        self._halt = threading.Event()  # set with ``_stop``, for work in threads
        self._stub: agent_pb2_grpc.AgentServiceStub | None = None
        self._probe_key = ""  # from the latest registration; checks the tickets of probes aimed here
        self._probe_port = 0  # where the probe server listens (0: none)
        self._checkpoint_port = 0  # where the checkpoint server listens, mutual TLS (0: none)
        self._job_credentials: JobCredentials | None = None  # the jobs' checkpoint TLS, made at start
        self._probe_tasks: set[asyncio.Task[None]] = set()
        self._probe_lock = asyncio.Lock()  # one probe at a time: two would share the link and halve it
        self._copy_locks: dict[str, asyncio.Lock] = {}  # checkpoint dir -> one copy into it at a time
        self._channels: dict[str, grpc.aio.Channel] = {}  # one per control-plane replica, made on first use
        self._server_index = 0
        self._client_pair: tuple[bytes, bytes] | None = None  # mTLS: the node's key and certificate
        self._heartbeat_duty = Duty("heartbeat", lambda: self.heartbeat_interval_s, self._heartbeat)
        self.sandbox = SandboxProbe(False, "not probed yet")  # probed when the agent starts
        self._settled: float | None = None  # the host's contention, settled in this agent's turn
        self.venv_s = 0.0  # one venv build's CPU seconds, measured in the agent's turn (0: not)
        # The cache as last reported on this stream (None: not yet): reported again when it differs.
        self._cache_reported: tuple[list[str], list[str]] | None = None
        self._cache_duty = Duty("report-cache", lambda: CACHE_REPORT_EVERY_S, self._report_cache)
        self._profile_follows = False  # it registers before measuring its profile, which follows
        self._profile_report: agent_pb2.AgentMessage | None = None  # sent on each new stream
        self._measured = False  # the profile and the venv build are measured (or not to be)
        self._store_offer: agent_pb2.StoreProbe | None = None  # from the latest registration
        self._gpu_watch: GpuWatch | None = None  # NVML samples and health, on a GPU node
        # A Slurm cluster's capacity as last reported on this stream (None: not yet).
        self._capacity_reported: tuple[int, float] | None = None
        self._capacity_duty = Duty(
            "report-capacity", lambda: self.heartbeat_interval_s, self._report_capacity
        )

    # -- the whole life -------------------------------------------------------------------------
    async def run(self) -> int:
        """Run until SIGTERM/SIGINT (exit code 0) or a fatal error (exit code 2)."""
        s = self.settings
        self._stop = stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_stop_signal)
        s.work_dir.mkdir(parents=True, exist_ok=True)
        early = await self._prepare()
        if early is not None:
            return early
        servers = await self._start_servers()
        if servers is None:
            return 2
        probe_server, checkpoint_server = servers
        self._use_server(0)
        if self.devices and any(d.uuid for d in self.devices):
            self._gpu_watch = GpuWatch(self.devices).start()
        # Duties outlive ``stop``: heartbeats go on while the workers are being stopped.
        duties_stop = asyncio.Event()
        duties = [asyncio.create_task(run_duty(d, duties_stop)) for d in self._duties()]
        # Measuring runs beside the connection: the node registers and heartbeats meanwhile.
        duties.append(asyncio.create_task(self._measure()))
        connection = asyncio.create_task(self._connection_loop())
        stopping = asyncio.create_task(stop.wait())
        code = 0
        try:
            await asyncio.wait({connection, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if connection.done() and (exc := connection.exception()) is not None:
                log.error("%s", exc)
                code = 2
            log.info("agent stopping")
            await self._shutdown(connection)
        finally:
            stop.set()
            self._halt.set()  # a reference step still measuring ends with the agent
            duties_stop.set()
            probes = list(self._probe_tasks)  # a probe's result is worth nothing to a stopping agent
            for task in (*duties, connection, stopping, *probes):
                task.cancel()
            await asyncio.gather(*duties, connection, stopping, *probes, return_exceptions=True)
            if self._gpu_watch is not None:
                await asyncio.to_thread(self._gpu_watch.stop)
            for channel in self._channels.values():
                await channel.close(grace=0.5)
            if probe_server is not None:
                await probe_server.stop(0.5)
            if checkpoint_server is not None:
                await checkpoint_server.stop(0.5)
            self._save_state()  # still lists any worker group that would not stop, for the next agent
        return code

    async def _prepare(self) -> int | None:
        """Start-up before serving: the state file, a previous agent's leftovers, the devices and
        the sandbox (the profile is measured once registered). An exit code to end with, or None
        to go on."""
        s = self.settings
        stop = self._stop
        assert stop is not None
        try:
            self._state = AgentState.load(s.effective_state_file)
        except ValueError as exc:
            log.error("%s", exc)
            return 2
        for aid in await asyncio.to_thread(self._stop_leftovers):
            self._fail(aid, "the node's agent restarted; its workers were stopped")
        # Start-up steps run in threads that a signal does not interrupt: after each, a stopping
        # agent goes no further (it has registered nothing and started no worker).
        if stop.is_set():
            return 0
        if self.devices is None:
            try:
                self.devices = await find_devices(s)
            except Exception as exc:
                log.error("device detection failed: %s", exc)
                return 2
        if stop.is_set():
            return 0
        self.sandbox = await asyncio.to_thread(probe_sandbox, s)
        if self.sandbox.ok:
            log.info("sandbox: bubblewrap works; users' code runs confined")
        elif s.allow_unsandboxed:
            log.warning("sandbox: %s; users' code runs UNCONFINED (--allow-unsandboxed)", self.sandbox.reason)
        else:
            log.warning("sandbox: %s; this node refuses users' code", self.sandbox.reason)
        # Registered before it is measured: the node is listed "measuring" until the profile follows.
        self._profile_follows = s.measure_profile and self.profile is None and bool(self.devices)
        if stop.is_set():
            log.info("agent stopping before registration")
            return 0
        for d in self.devices:
            log.info(
                "device %d: %s %s, %.1f GB, %.4f TFLOPS",
                d.index,
                d.kind,
                d.model,
                d.memory_gb,
                d.measured_tflops,
            )
        return None

    async def _measure(self) -> None:
        """The node's profile (the reference step; in the same turn of the host, one venv build
        and the contention settling after it), measured while the node is registered: sent up
        when done (again on each new stream), then the store probe the registration offered."""
        s = self.settings
        assert self.devices is not None
        try:
            if self._profile_follows:
                await self._measure_profile()
            if self._builds_venvs and not self.venv_s:  # no reference step's turn measured it

                def own_turn() -> None:
                    with one_reference_at_a_time(cancel=self._halt):
                        if not self._halt.is_set():
                            self._measure_venv()

                await asyncio.to_thread(own_turn)
            if self.profile is not None and self._probes_cpu and self._settled is None:
                # A profile given rather than measured settles here.
                self._settled = await asyncio.to_thread(contention.settle, self._contention)
        except Cancelled as exc:
            log.info("agent stopping: %s", exc)
            return
        except Exception:  # a venv build or a settle that failed: the node serves without it
            log.exception("measuring the node failed")
        if self._settled is not None:
            log.info("host CPU contention after the reference step: %.2f", self._settled)
        self._measured = True
        if s.probe_staging and self._store_offer is not None:
            await self._probe_staging(self._store_offer)

    async def _measure_profile(self) -> None:
        """Measure the profile and send it up (a failed measurement is sent as its error: the node
        is then placed on its declared figures rather than left measuring)."""
        s = self.settings
        assert self.devices is not None

        def in_turn() -> None:
            self._measure_venv()
            if self._probes_cpu:
                self._settled = contention.settle(self._contention)

        report = agent_pb2.ProfileReport()
        # The host after this agent's own measurement, not during it nor during the next
        # co-located agent's: settled in this agent's turn (``measure_profile``).
        try:
            self.profile = await asyncio.to_thread(
                measure_profile,
                self.devices[0].kind,
                s.work_dir / "reference",
                then=in_turn,
                device_model=self.devices[0].model,
                shared_max_age_s=s.profile_share_s,
                cancel=self._halt,
                cuda_devices=[d.uuid for d in self.devices if d.kind == "cuda" and d.uuid],
            )
        except Cancelled:
            raise
        except Exception as exc:  # the node still serves on its declared figures
            log.exception("measuring the profile failed")
            report.error = f"measuring the profile failed: {exc}"
        if self._settled is not None:  # the host once measuring is over, for the first quotes
            report.cpu_contention = self._contention.value
            report.cpu_contention_probe_ages_s.extend(self._contention.kept_ages())
        if self.profile is not None:
            log.info("worker profile: %s", self.profile.as_dict())
            report.measured_profile.CopyFrom(profile_to_proto(self.profile))
        elif not report.error:
            report.error = "the reference step gave no profile"
        self._profile_report = agent_pb2.AgentMessage(profile=report)
        if self._connected:  # else the next stream's acknowledgement sends it
            self._outbox.put(self._profile_report)

    async def _start_servers(self) -> tuple[Any, Any] | None:
        """The probe server and the checkpoint copies' server (each None where its port is -1);
        None when one cannot start."""
        s = self.settings
        probe_server = None
        if s.probe_port >= 0:
            try:
                probe_server, self._probe_port = build_probe_server(
                    self._probe_identity, s.probe_bind, s.probe_port
                )
            except (OSError, RuntimeError) as exc:
                log.error("probe server: %s", exc)
                return None
            await probe_server.start()
            log.info("link probes served on %s:%d", s.probe_bind, self._probe_port)
        self._job_credentials = credentials = await asyncio.to_thread(JobCredentials, s.work_dir)
        checkpoint_server = None
        if s.checkpoint_port >= 0:
            try:
                # Copies between the region's nodes: tickets signed with the probe key, mutual TLS
                # with each job's credentials on a port of their own.
                checkpoint_server, self._checkpoint_port = build_checkpoint_server(
                    self._probe_identity, s.work_dir, credentials, s.probe_bind, s.checkpoint_port
                )
            except (OSError, RuntimeError) as exc:
                log.error("checkpoint server: %s", exc)
                return None
            await checkpoint_server.start()
            log.info("checkpoint copies served over TLS on %s:%d", s.probe_bind, self._checkpoint_port)
        return probe_server, checkpoint_server

    def _on_stop_signal(self) -> None:
        assert self._stop is not None
        self._stop.set()
        self._halt.set()  # for the start-up steps that run in threads (the reference step)

    async def _shutdown(self, connection: asyncio.Task[None]) -> None:
        self._draining = True
        live = [r for r in self._runs.values() if not r.done]
        await asyncio.gather(*(r.stop("the node's agent is stopping", FAILED) for r in live))
        if self._run_tasks:
            await asyncio.wait(self._run_tasks, timeout=self.settings.kill_grace_s + 5)
        if self._connected and not connection.done():
            # Half-close once the queue is empty so the final states reach the server.
            self._outbox.close()
            await asyncio.wait({connection}, timeout=3)

    def _duties(self) -> list[Duty]:
        s = self.settings
        return [
            self._heartbeat_duty,
            Duty("probe-contention", lambda: self.heartbeat_interval_s, self._probe_contention),
            Duty("flush-metrics", lambda: max(0.05, s.metrics_min_interval_s), self._flush_metrics),
            Duty("forget-finished", lambda: 30.0, self._forget_finished),
            Duty("restate-running", lambda: 30.0, self._restate_running),
            Duty("retention", lambda: min(600.0, max(1.0, s.checkpoint_retention_h * 900)), self._retention),
            self._cache_duty,
            self._capacity_duty,
        ]

    # -- registration and the stream ------------------------------------------------------------
    async def _connection_loop(self) -> None:
        s = self.settings
        backoff = s.reconnect_min_s
        registered = False
        assert self._stop is not None
        while not self._stop.is_set():
            acked = False
            try:
                if not registered:
                    await self._register()
                    registered = True
                acked = await self._session()
            except _Reregister:
                registered = False
            except grpc.aio.AioRpcError as exc:
                log.warning(
                    "control plane %s unreachable: %s %s", self._target, exc.code().name, exc.details()
                )
            if self._stop.is_set():
                return
            if len(s.servers) > 1:
                # Fail over: the next try goes to the next replica (a restarted or killed one may
                # not be back; any replica serves every node).
                self._use_server(self._server_index + 1)
            if acked:
                backoff = s.reconnect_min_s  # a session that got going starts the backoff afresh
            # Jitter spreads a fleet's reconnects after a control-plane restart.
            delay = min(backoff, reconnect_cap_s(s, self.heartbeat_interval_s)) * random.uniform(0.5, 1.0)
            log.info("reconnecting to %s in %.1fs", self._target, delay)
            await asyncio.sleep(delay)
            backoff = min(reconnect_cap_s(s, self.heartbeat_interval_s), backoff * 2)

    @property
    def _target(self) -> str:
        return self.settings.servers[self._server_index]

    def _use_server(self, index: int) -> None:
        s = self.settings
        self._server_index = index % len(s.servers)
        target = self._target
        channel = self._channels.get(target)
        if channel is None:
            options = channel_options(s, reconnect_cap_s(s, self.heartbeat_interval_s))
            channel = self._channels[target] = make_channel(s, target, options, self._client_pair)
        self._stub = agent_pb2_grpc.AgentServiceStub(channel)

    async def _enroll_stub(self) -> tuple[agent_pb2_grpc.AgentServiceStub, grpc.aio.Channel | None]:
        """Where to register: the enrollment port under mTLS (a fresh channel, closed after), else
        the current replica."""
        s = self.settings
        if not s.enroll_servers:
            assert self._stub is not None
            return self._stub, None
        target = s.enroll_servers[self._server_index % len(s.enroll_servers)]
        channel = make_channel(s, target, channel_options(s, reconnect_cap_s(s, self.heartbeat_interval_s)))
        return agent_pb2_grpc.AgentServiceStub(channel), channel

    async def _take_certificate(self, cert_pem: str) -> None:
        """Use the certificate the control plane issued from now on (new channels carry it)."""
        s = self.settings
        if not cert_pem:
            raise AgentFatal("the control plane issued no node certificate (does it run a node CA?)")
        assert self._client_pair is not None
        s.node_cert_file.write_text(cert_pem)
        self._client_pair = (self._client_pair[0], cert_pem.encode())
        old, self._channels = self._channels, {}
        for channel in old.values():
            await channel.close(grace=0.5)
        self._use_server(self._server_index)

    async def _register(self) -> None:
        s = self.settings
        assert self._stub is not None and self.devices is not None
        creds = self._state.credentials
        if creds is not None and not creds.fits(s.server, s.region, s.cluster):
            log.info("stored credentials are for another server or cluster; registering afresh")
            creds = None
        if creds is None and not s.token:
            raise AgentFatal("no enrollment token (--token) and no stored node credentials to register with")
        request = agent_pb2.RegisterRequest(
            enrollment_token=s.token if creds is None else "",
            region=s.region,
            cluster=s.cluster,
            provider=s.provider,
            hostname=s.hostname,
            devices=[device_to_proto(d) for d in self.devices],
            price_per_device_hour=s.price_per_device_hour,
            spot_price_per_device_hour=s.spot_price_per_device_hour,
            agent_version=AGENT_VERSION,
            advertise_host=s.advertise_host,
            sync_port_min=s.sync_ports[0],
            sync_port_max=s.sync_ports[1],
            intra_bandwidth_gbps=s.intra_bandwidth_gbps,
            node_fabric_gbps=s.node_fabric_gbps,
            node_fabric_latency_ms=s.node_fabric_latency_ms,
            cross_cluster_host=s.cross_cluster_host,
            jurisdiction=s.jurisdiction,
            node_id=creds.node_id if creds else "",
            node_token=creds.node_token if creds else "",
            probe_port=self._probe_port,
            checkpoint_port=self._checkpoint_port,
            cpu_contention=self._contention.value,
            cpu_contention_probe_ages_s=self._contention.kept_ages(),
            sandbox=self.sandbox.capability(s.allow_unsandboxed),
        )
        if self.profile is not None:
            request.measured_profile.CopyFrom(profile_to_proto(self.profile))
        else:
            request.profile_follows = self._profile_follows
        if s.enroll_servers:
            key = await asyncio.to_thread(load_or_create_key, s.node_key_file)
            self._client_pair = (key, self._client_pair[1] if self._client_pair else b"")
            request.csr_pem = certificate_request(key, s.hostname).decode()
        stub, enroll_channel = await self._enroll_stub()
        try:
            response = await stub.Register(request, timeout=s.rpc_timeout_s)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNAUTHENTICATED and creds is not None:
                log.warning("stored node credentials were refused; registering with the enrollment token")
                self._state.credentials = None
                self._save_state()
                return await self._register()
            if exc.code() in FATAL_REGISTER_CODES:
                raise AgentFatal(f"registration refused ({exc.code().name}): {exc.details()}") from None
            raise
        finally:
            if enroll_channel is not None:
                await enroll_channel.close(grace=0.5)
        if s.enroll_servers:
            await self._take_certificate(response.node_certificate_pem)
        self._state.credentials = Credentials(
            server=s.server,
            region=s.region,
            cluster=s.cluster,
            node_id=response.node_id,
            node_token=response.node_token,
            cluster_id=response.cluster_id,
        )
        self.heartbeat_interval_s = response.heartbeat_interval_s or self.heartbeat_interval_s
        self._probe_key = response.probe_key
        self._save_state()
        log.info("registered as node %s in %s/%s", response.node_id, s.region, s.cluster)
        # Probed once measuring is over (no reference step then shares the host with it): here
        # if it is, else where it ends (``_measure``).
        self._store_offer = response.store_probe
        if s.probe_staging and self._measured:
            await self._probe_staging(response.store_probe)

    @property
    def _builds_venvs(self) -> bool:
        """Whether this node will build users' venvs: it probes staging and runs users' code."""
        return self.settings.probe_staging and (self.sandbox.ok or self.settings.allow_unsandboxed)

    def _measure_venv(self) -> None:
        """One venv build's CPU seconds (blocking). A build is a burst of CPU like the reference
        step: measured in this agent's turn of the host, beside no co-located agent's step."""
        if self._builds_venvs:
            self.venv_s = staging_probe.measure_venv(self.settings.work_dir, self.settings)
            log.info("venv build: %.2f CPU seconds", self.venv_s)

    async def _probe_staging(self, offered: agent_pb2.StoreProbe) -> None:
        """Measure the link to the store on the probe the control plane offered, holding the probe
        lock: no link probe shares this node's link with it. The result (with the venv build's
        figure) goes up the stream."""
        blobs = [staging_probe.ProbeBlob(b.url, b.digest, b.bytes) for b in offered.blobs]
        if blobs:
            async with self._probe_lock:
                got = await asyncio.to_thread(
                    staging_probe.probe_store, blobs, self.settings.work_dir.resolve(), self.settings
                )
            if got.error:
                log.warning("%s", got.error)
            else:
                log.info("store probe: %.4f s per fetch, %.0f bytes/s", got.fetch_fixed_s, got.bytes_per_s)
        else:
            got = StagingProbe(error="the control plane offered no store probe")
        if got.store_measured or self.venv_s:
            self._outbox.put(
                agent_pb2.AgentMessage(
                    staging_probe=agent_pb2.StagingProbeResult(
                        fetch_fixed_s=got.fetch_fixed_s,
                        bytes_per_s=got.bytes_per_s,
                        probe_bytes=got.probe_bytes,
                        venv_s=self.venv_s,
                        error=got.error,
                    )
                )
            )

    async def _session(self) -> bool:
        """One Connect stream, until it ends. Returns whether the server acknowledged it."""
        assert self._stub is not None and self._state.credentials is not None
        creds = self._state.credentials
        running = [aid for aid, r in self._runs.items() if not r.done]
        hello = agent_pb2.Hello(
            node_id=creds.node_id, node_token=creds.node_token, running_assignments=running
        )
        self._outbox.drop_heartbeats()
        session = _Session()
        call = self._stub.Connect(self._requests(hello, session))
        try:
            async for message in call:
                kind = message.WhichOneof("kind")
                if kind == "ack":
                    self._on_ack(message.ack, session)
                elif kind == "assignment":
                    self._on_assignment(message.assignment)
                elif kind == "cancel":
                    self._on_cancel(message.cancel)
                elif kind == "preempt":
                    self._on_preempt(message.preempt)
                elif kind == "probe":
                    self._on_probe(message.probe)
                elif kind == "peer_lost":
                    self._on_peer_lost(message.peer_lost)
                elif kind == "checkpoint_copy":
                    self._on_checkpoint_copy(message.checkpoint_copy)
                elif kind == "drain":
                    self._draining = True
                    log.warning("drain ordered: %s; accepting no new assignments", message.drain.reason)
            log.warning("control plane ended the stream")
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                log.warning("node credentials refused on connect: %s", exc.details())
                raise _Reregister from None
            if not session.acked.is_set():
                raise
            log.warning("stream broke: %s %s", exc.code().name, exc.details())
        finally:
            session.active = False
            self._connected = False
            call.cancel()
        return session.acked.is_set()

    async def _requests(
        self, hello: agent_pb2.Hello, session: _Session
    ) -> AsyncIterator[agent_pb2.AgentMessage]:
        yield agent_pb2.AgentMessage(hello=hello)
        await session.acked.wait()  # nothing queued is risked on a stream the server may refuse
        while session.active:
            message = await self._outbox.get()
            if message is None:
                return  # stopping: half-close
            if not session.active:
                self._outbox.requeue(message)
                return
            yield message

    def _on_ack(self, ack: agent_pb2.Ack, session: _Session) -> None:
        self.heartbeat_interval_s = ack.heartbeat_interval_s or self.heartbeat_interval_s
        self._connected = True
        session.acked.set()
        self._heartbeat_duty.poke()  # at the server's rate from now, not after the old interval
        self._cache_reported = None  # the cache as it is now, on this stream
        self._cache_duty.poke()
        self._capacity_reported = None  # likewise the cluster's capacity
        self._capacity_duty.poke()
        log.info("connected as node %s (heartbeat every %.1fs)", ack.node_id, self.heartbeat_interval_s)
        assert self.devices is not None
        self._outbox.put(
            agent_pb2.AgentMessage(
                inventory=agent_pb2.Inventory(devices=[device_to_proto(d) for d in self.devices])
            )
        )
        # Whatever was said before the break may be lost (in flight on the broken stream, or never
        # applied by a control plane that died): say every task's current state and newest metrics
        # again. The control layer ignores repeated states and metrics of steps it already has.
        for run in self._runs.values():
            if (metrics := run.latest_metrics()) is not None:
                self._outbox.put(metrics)
            self._outbox.put(run.current)
        for message, _ in self._finals.values():
            self._outbox.put(message)
        if self._profile_report is not None:  # repeats change nothing; a lost one would strand it
            self._outbox.put(self._profile_report)

    # -- orders from the control plane ----------------------------------------------------------
    def _fail(self, assignment_id: str, message: str) -> None:
        status = agent_pb2.AgentMessage(
            task_status=agent_pb2.TaskStatus(assignment_id=assignment_id, state=FAILED, message=message)
        )
        self._finals[assignment_id] = (status, time.monotonic())
        self._outbox.put(status)

    def _on_assignment(self, msg: agent_pb2.Assignment) -> None:
        aid = msg.assignment_id
        if aid in self._runs or aid in self._finals:
            # Re-sent after a reconnect: never launch twice; repeat how it ended if it has.
            run = self._runs.get(aid)
            final = run.current if run is not None else self._finals[aid][0]
            if run is None or run.done:
                self._outbox.put(final)
            return
        try:
            a = Assignment.from_proto(msg)
        except InvalidArgument as exc:
            log.error("refusing assignment %s: %s", aid, exc.message)
            if aid:
                self._fail(aid, exc.message)
            return
        if self._draining:
            return self._fail(aid, "node is draining")
        assert self.devices is not None
        by_index = {d.index: d for d in self.devices}
        kinds = {d.index: d.kind for d in self.devices}
        unknown = [i for i in a.device_indices if i not in kinds]
        if unknown:
            return self._fail(aid, f"device_indices: node has no device(s) {unknown}")
        if a.device_indices and a.nproc != len(a.device_indices):
            return self._fail(
                aid, f"nproc ({a.nproc}) must equal the number of device_indices {list(a.device_indices)}"
            )
        kind = kinds[a.device_indices[0]] if a.device_indices else self.devices[0].kind
        sandbox = needs_sandbox(a.worker_config)
        if sandbox and not self.sandbox.ok:
            if not self.settings.allow_unsandboxed:
                return self._fail(
                    aid,
                    f"users' code needs a sandbox and this node has none ({self.sandbox.reason});"
                    " its provider may allow unsandboxed users' code with --allow-unsandboxed",
                )
            sandbox = False
        tls = CheckpointTls.from_dict((a.worker_config.get("checkpoint") or {}).get("tls"))
        if tls is not None and self._job_credentials is not None:
            # Its task's checkpoints are served with them (to a copy, or to its re-placement).
            self._job_credentials.add(a.job_id, tls)
        run = WorkerRun(
            a,
            self.settings.work_dir.resolve() / "assignments" / aid,
            settings=self.settings,
            device_kind=kind,
            send=self._outbox.put,
            on_spawn=self._remember_worker,
            sandbox=sandbox,
            launcher=self._launcher,
            devices=[by_index[i] for i in a.device_indices],
        )
        self._runs[aid] = run
        task = asyncio.create_task(self._supervise(run))
        self._run_tasks.add(task)
        task.add_done_callback(self._run_tasks.discard)

    async def _supervise(self, run: WorkerRun) -> None:
        try:
            await run.run()
        except Exception as exc:
            log.exception("assignment %s: supervising failed", run.assignment.assignment_id)
            if not run.done:
                await run.stop(f"agent error: {exc}", FAILED)
                self._fail(run.assignment.assignment_id, f"agent error while supervising workers: {exc}")
        finally:
            if self._state.workers.pop(run.assignment.assignment_id, None) is not None:
                self._save_state()

    def _on_cancel(self, msg: agent_pb2.Cancel) -> None:
        run = self._runs.get(msg.assignment_id)
        if run is not None and not run.done:
            log.info("assignment %s: cancel (%s)", msg.assignment_id, msg.reason)
            self._start(run.stop(msg.reason or "cancelled"))
        else:
            self._restate_end(msg.assignment_id)

    def _on_preempt(self, msg: agent_pb2.Preempt) -> None:
        run = self._runs.get(msg.assignment_id)
        if run is not None and not run.done:
            reason = msg.reason[:1024] or "preempted"
            # A grace the message leaves out (0), or absurd, falls back to the kill grace's bounds.
            grace = msg.grace_s if 0 < msg.grace_s <= MAX_PREEMPT_GRACE_S else self.settings.kill_grace_s
            log.info("assignment %s: preempt (%s), grace %.0fs", msg.assignment_id, reason, grace)
            self._start(run.preempt(reason, grace))
        else:
            self._restate_end(msg.assignment_id)

    def _start(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coroutine)
        self._run_tasks.add(task)
        task.add_done_callback(self._run_tasks.discard)

    def _restate_end(self, assignment_id: str) -> None:
        """Settle the control plane's view of an assignment that is not running here (finished,
        or never here) after an order to stop it."""
        run = self._runs.get(assignment_id)
        if run is not None:
            self._outbox.put(run.current)
        elif assignment_id in self._finals:
            self._outbox.put(self._finals[assignment_id][0])
        else:  # never ran here
            self._outbox.put(
                agent_pb2.AgentMessage(
                    task_status=agent_pb2.TaskStatus(
                        assignment_id=assignment_id,
                        state=agent_pb2.TASK_STATE_CANCELLED,
                        message="not running on this node",
                    )
                )
            )

    def _on_peer_lost(self, msg: agent_pb2.PeerLost) -> None:
        run = self._runs.get(msg.assignment_id)
        if run is None or not msg.participant:
            return  # finished or never here: nobody waits for the peer
        log.info("assignment %s: peer %s lost (%s)", msg.assignment_id, msg.participant, msg.reason)
        run.note_peer_lost(msg.participant[:256], msg.address[:512], msg.reason[:1024])

    def _on_probe(self, order: agent_pb2.LinkProbeOrder) -> None:
        task = asyncio.create_task(self._probe(order))
        self._probe_tasks.add(task)
        task.add_done_callback(self._probe_tasks.discard)

    async def _probe(self, order: agent_pb2.LinkProbeOrder) -> None:
        async with self._probe_lock:
            result = await run_probe(order)
        if result.error:
            log.warning(
                "link probe %s to %s failed: %s", order.ticket.probe_id, order.target_host, result.error
            )
        else:
            log.info(
                "link probe %s to %s:%d: rtt %.2f ms, %d bytes in %.3fs",
                order.ticket.probe_id,
                order.target_host,
                order.target_port,
                result.rtt_ms,
                result.bulk_bytes,
                result.bulk_s,
            )
        self._outbox.put(agent_pb2.AgentMessage(probe_result=result))

    def _on_checkpoint_copy(self, order: agent_pb2.CheckpointCopyOrder) -> None:
        task = asyncio.create_task(self._copy(order))
        self._probe_tasks.add(task)  # stopped with the probes: a stopping agent keeps no copies
        task.add_done_callback(self._probe_tasks.discard)

    async def _copy(self, order: agent_pb2.CheckpointCopyOrder) -> None:
        """Fetch a checkpoint another node of the region completed, in the background (the workers
        that wrote it go on training), and say how it went."""
        ticket = ticket_from_proto(order.ticket)
        tls = tls_from_proto(order.tls) if order.HasField("tls") else None
        lock = self._copy_locks.setdefault(ticket.dir, asyncio.Lock())
        async with lock:
            nbytes, seconds, error = await run_copy(
                self.settings.work_dir, ticket, order.source_host, order.source_port, tls
            )
        if not error and tls is not None and self._job_credentials is not None:
            # It serves this copy from now on, to whichever node the job is re-placed on.
            await asyncio.to_thread(self._job_credentials.add, order.job_id, tls)
        if error:
            log.warning(
                "checkpoint copy %s (%s step %d) failed: %s",
                ticket.transfer_id,
                ticket.dir,
                ticket.step,
                error,
            )
        else:
            log.info(
                "checkpoint copy %s: %s step %d, %d bytes in %.2fs",
                ticket.transfer_id,
                ticket.dir,
                ticket.step,
                nbytes,
                seconds,
            )
        self._outbox.put(
            agent_pb2.AgentMessage(
                checkpoint_copy_result=agent_pb2.CheckpointCopyResult(
                    transfer_id=ticket.transfer_id, bytes=nbytes, duration_s=seconds, error=error
                )
            )
        )

    def _probe_identity(self) -> tuple[str, str] | None:
        creds = self._state.credentials
        if creds is None or not self._probe_key:
            return None
        return creds.node_id, self._probe_key

    # -- duties ---------------------------------------------------------------------------------
    def _heartbeat(self) -> None:
        if not self._connected:
            return
        self._seq += 1
        gpus = self._gpu_watch.latest() if self._gpu_watch is not None else None
        self._outbox.put(
            agent_pb2.AgentMessage(
                heartbeat=agent_pb2.Heartbeat(
                    seq=self._seq,
                    sent_at=time.time(),
                    load=os.getloadavg()[0],
                    cpu_contention=self._contention.value,
                    cpu_contention_probe_ages_s=self._contention.kept_ages(),
                    devices=[sample_to_proto(x) for x in gpus.samples] if gpus else [],
                    node_health=gpus.node_health if gpus else "",
                )
            )
        )

    @property
    def _probes_cpu(self) -> bool:
        """Only CPU slots take turns on the host's cores: only their nodes measure contention."""
        devices = self.devices or []
        return bool(devices) and devices[0].kind == "cpu"

    async def _probe_contention(self) -> None:
        """What the host leaves a new CPU worker, measured only while this node runs none of its
        own (and not while the last one exits): a quote prices its own workers on top of it."""
        if not self._probes_cpu:
            return
        now = time.monotonic()
        if now - self._own_exited_at < contention.QUIET_AFTER_S or any(
            not r.done or now - (r.finished_at or 0.0) < contention.QUIET_AFTER_S for r in self._runs.values()
        ):
            return
        if await asyncio.to_thread(another_measuring):
            return  # a co-located agent's reference step: its start-up, not the host's load
        self._contention.add(await asyncio.to_thread(contention.probe))

    def _flush_metrics(self) -> None:
        for run in self._runs.values():
            if not run.done:
                run.flush_metrics()

    def _restate_running(self) -> None:
        """Say again what runs here. Repeats change nothing on the server, except that a task it
        has given up on (say, while it thought this node lost) gets a cancel back."""
        if self._connected:
            for run in self._runs.values():
                if not run.done:
                    self._outbox.put(run.current)

    async def _retention(self) -> None:
        """Delete the checkpoints and run dirs of jobs whose last task here ended longer than the
        provider's retention ago, never those of a job with a task on the node."""
        live = {r.assignment.job_id for r in self._runs.values() if not r.done}
        retention_s = self.settings.checkpoint_retention_h * 3600
        # Moved aside here, on the loop, where no assignment of those jobs can start meanwhile;
        # deleted in a thread (a checkpoint can be large).
        _, trash = cleanup.take_expired(self.settings.work_dir, live, retention_s, time.time())
        trash += [p for p in (self.settings.work_dir / cleanup.TRASH).glob("*") if p not in trash]
        await asyncio.to_thread(cleanup.remove, trash)
        if self._job_credentials is not None:  # a job's credentials go with the last of its checkpoints
            held = self.settings.work_dir / "checkpoints"
            kept = {d.name for d in held.iterdir()} if held.is_dir() else set()
            await asyncio.to_thread(self._job_credentials.keep_only, kept | live)

    def _forget_finished(self) -> None:
        now = time.monotonic()
        keep = self.settings.finished_retention_s
        for aid, run in list(self._runs.items()):
            if run.finished_at is not None:
                # Still quiet after it for the contention probes, which no longer see the run.
                self._own_exited_at = max(self._own_exited_at, run.finished_at)
                del self._runs[aid]
                self._finals[aid] = (run.current, run.finished_at)
        for aid, (_, at) in list(self._finals.items()):
            if now - at > keep:
                del self._finals[aid]

    async def _report_cache(self) -> None:
        """Say what the cache holds where it changed since the last report on this stream."""
        if not self._connected:
            return
        listing = await asyncio.to_thread(staging_probe.cache_listing, self.settings.work_dir.resolve())
        if listing == self._cache_reported:
            return
        self._cache_reported = listing
        blobs, venvs = listing
        self._outbox.put(agent_pb2.AgentMessage(cache=agent_pb2.CacheReport(blobs=blobs, venvs=venvs)))

    async def _report_capacity(self) -> None:
        """On a Slurm cluster, how many registered devices are not cpn's to use now and the queue
        wait (re-read at the heartbeat's rate), said where it changed since the last report on
        this stream (the wait on a coarse grid: a second's drift is no news)."""
        if not self._connected or self.devices is None:
            return
        running = agent_pb2.TASK_STATE_RUNNING
        held = sum(
            r.scheduler_slots
            for r in self._runs.values()
            if not r.done and r.current.task_status.state == running
        )
        registered = len(self.devices)
        capacity = await cluster_capacity(self.settings, self._launcher, registered=registered, held=held)
        if capacity is None:
            return
        reported = (capacity[0], coarse_wait_s(capacity[1]))
        if reported == self._capacity_reported:
            return
        self._capacity_reported = reported
        message = agent_pb2.Capacity(devices_unavailable=reported[0], queue_wait_s=reported[1])
        self._outbox.put(agent_pb2.AgentMessage(capacity=message))

    # -- state ----------------------------------------------------------------------------------
    def _remember_worker(self, run: WorkerRun) -> None:
        self._state.workers[run.assignment.assignment_id] = {**run.record, "dir": str(run.run_dir)}
        self._save_state()
        self._cache_duty.poke()  # its staging is done: the cache may hold more now

    def _save_state(self) -> None:
        self._state.save(self.settings.effective_state_file)

    def _stop_leftovers(self) -> list[str]:
        """Stop worker groups a killed predecessor left running; return their assignment ids
        (to be reported failed: their output went with the process that read it)."""
        ids = list(self._state.workers)
        for aid, info in self._state.workers.items():
            if "slurm_job" in info:
                stopped = cancel_leftover_job(str(info["slurm_job"]), aid)
            else:
                stopped = stop_leftover(
                    int(info.get("pgid", 0)), str(info.get("dir", "")), self.settings.kill_grace_s
                )
            if stopped:
                log.warning("stopped assignment %s left running by a previous agent process", aid)
        self._state.workers.clear()
        self._save_state()
        return ids
