"""Checkpoint copies between the nodes of a region: the CheckpointService an agent serves, and the
fetch it runs on the control plane's orders (a copy after a checkpoint completes, or before
launching a task re-placed on a node that lacks its checkpoint).

The source streams a manifest (every file's size and SHA-256) and then the files; the receiver
writes into ``step_N.partial`` under the same directory of its own work dir, checks every size and
hash, and renames the directory into place only when all agree, so an interrupted or corrupt copy
is never resumed from (``training.checkpoint`` resumes only from ``step_N`` with ``COMPLETE``).

Copies run over mutual TLS only, with the job's credentials (``JobCredentials``): the job's CA,
the one its cross-region sync trusts, and a certificate of it naming the job's checkpoint server.
The agent's checkpoint port answers each job's fetch (chosen by the client's SNI) with that job's
certificate and accepts only client certificates of a CA it holds; the servicer then requires the
client's to be of the ticket's own job. A node holds a job's credentials from the assignment of
its task there or from the copy order that brought it a copy, and keeps them (mode 0600) while it
keeps the job's checkpoints, so that it can serve them after a restart.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from contracts.checkpoint_transfer import (
    CHUNK_BYTES,
    MAX_TICKET_TTL_S,
    CheckpointTicket,
    CheckpointTls,
    check_dir,
    check_manifest,
    checkpoint_server_name,
    job_of_dir,
    verify,
)
from contracts.errors import CpnError, FailedPrecondition, InvalidArgument, NotFound, Unauthenticated
from contracts.step_dirs import remove_step_dir
from proto.cpn.agent.v1 import agent_pb2, agent_pb2_grpc

log = logging.getLogger(__name__)

DONE = "COMPLETE"  # training.checkpoint's marker of a complete save
TLS_DIR = "checkpoint-tls"  # under the work dir: the jobs' credentials, one file per job
_JOB_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")  # as a checkpoint dir's job part (``check_dir``)
KEEP_COPIES = 2  # complete steps a receiver keeps per directory (training.checkpoint's keep_last)
MAX_CONCURRENT_CALLS = 16  # copies served at once
MAX_MESSAGE_BYTES = CHUNK_BYTES + 64 * 1024  # a chunk, or a manifest of typical size


def step_name(step: int) -> str:
    return f"step_{step:08d}"


def ticket_from_proto(t: agent_pb2.CheckpointTicket) -> CheckpointTicket:
    return CheckpointTicket(t.transfer_id, t.source_node_id, t.dir, t.step, t.max_bytes, t.expires_at, t.mac)


def ticket_to_proto(t: CheckpointTicket) -> agent_pb2.CheckpointTicket:
    return agent_pb2.CheckpointTicket(
        transfer_id=t.transfer_id,
        source_node_id=t.source_node_id,
        dir=t.dir,
        step=t.step,
        max_bytes=t.max_bytes,
        expires_at=t.expires_at,
        mac=t.mac,
    )


def _status(exc: CpnError) -> grpc.StatusCode:
    if isinstance(exc, Unauthenticated):
        return grpc.StatusCode.UNAUTHENTICATED
    if isinstance(exc, NotFound):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(exc, InvalidArgument):
        return grpc.StatusCode.INVALID_ARGUMENT
    return grpc.StatusCode.FAILED_PRECONDITION


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK_BYTES), b""):
            h.update(block)
    return h.hexdigest()


def manifest(step_dir: Path) -> list[tuple[str, int, str]]:
    """(path, size, sha256) of every file under a complete checkpoint's directory, ``COMPLETE`` last."""
    files = sorted(p for p in step_dir.rglob("*") if p.is_file() and not p.is_symlink())
    files.sort(key=lambda p: p.name == DONE)
    return [(p.relative_to(step_dir).as_posix(), p.stat().st_size, _sha256(p)) for p in files]


def tls_from_proto(t: agent_pb2.CheckpointTls) -> CheckpointTls | None:
    return CheckpointTls.from_dict({"ca_pem": t.ca_pem, "cert_pem": t.cert_pem, "key_pem": t.key_pem})


def _ca_name(pem: str) -> x509.Name:
    return x509.load_pem_x509_certificate(pem.encode()).subject


def _placeholder() -> tuple[bytes, bytes]:
    """A key and self-signed certificate no client trusts: what the port presents before the node
    holds any job's credentials (a TLS server needs one)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "cpn checkpoints: no job here yet")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=3650))
        .sign(key, hashes.SHA256())
    )
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return pem, cert.public_bytes(serialization.Encoding.PEM)


class JobCredentials:
    """The jobs' checkpoint credentials this node holds, kept under ``<work_dir>/checkpoint-tls``
    (owner-readable only) so that what it received stays servable after a restart. The TLS
    server's certificate configuration follows it (``server_credentials``)."""

    def __init__(self, work_dir: Path) -> None:
        self._dir = work_dir / TLS_DIR
        self._lock = threading.Lock()  # the server's fetcher runs on gRPC's own threads
        self._jobs: dict[str, CheckpointTls] = {}
        self._version, self._served = 0, -1
        self._placeholder = _placeholder()
        for path in sorted(self._dir.glob("*.json")) if self._dir.is_dir() else []:
            try:
                tls = CheckpointTls.from_dict(json.loads(path.read_text()))
            except (OSError, ValueError):
                tls = None
            if tls is not None and _JOB_ID.match(path.stem):
                self._jobs[path.stem] = tls
        self._version += 1

    def get(self, job_id: str) -> CheckpointTls | None:
        with self._lock:
            return self._jobs.get(job_id)

    def add(self, job_id: str, tls: CheckpointTls) -> None:
        """Hold (and keep) ``tls`` for ``job_id``, replacing what was held (a newer certificate)."""
        if not _JOB_ID.match(job_id):
            raise InvalidArgument(
                f"job id {job_id[:80]!r} cannot name checkpoint credentials", field="job_id"
            )
        with self._lock:
            if self._jobs.get(job_id) == tls:
                return
            self._dir.mkdir(parents=True, exist_ok=True)
            path = self._dir / f"{job_id}.json"
            tmp = path.with_name(path.name + ".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(tls.as_dict(), f)
            os.replace(tmp, path)
            self._jobs[job_id] = tls
            self._version += 1

    def keep_only(self, job_ids: Iterable[str]) -> None:
        """Forget the credentials of jobs whose checkpoints are gone from the node."""
        keep = set(job_ids)
        with self._lock:
            for job_id in [j for j in self._jobs if j not in keep]:
                del self._jobs[job_id]
                (self._dir / f"{job_id}.json").unlink(missing_ok=True)
                self._version += 1

    def ca_name(self, job_id: str) -> x509.Name | None:
        tls = self.get(job_id)
        return _ca_name(tls.ca_pem) if tls is not None else None

    def _configuration(self) -> grpc.ServerCertificateConfiguration:
        pairs = [(t.key_pem.encode(), t.cert_pem.encode()) for _, t in sorted(self._jobs.items())]
        roots = b"".join(t.ca_pem.encode() for _, t in sorted(self._jobs.items()))
        if not pairs:
            pairs, roots = [self._placeholder], self._placeholder[1]
        return grpc.ssl_server_certificate_configuration(pairs, root_certificates=roots)

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        # Called by gRPC before every handshake: None keeps the configuration it has.
        with self._lock:
            if self._served == self._version:
                return None
            self._served = self._version
            return self._configuration()

    def server_credentials(self) -> grpc.ServerCredentials:
        """Every held job's certificate (the client's SNI picks its job's) and every held job's CA
        for client certificates: mutual TLS, refreshed as jobs come and go."""
        with self._lock:
            self._served = self._version
            initial = self._configuration()
        return grpc.dynamic_ssl_server_credentials(initial, self._fetch, require_client_authentication=True)


def _peer_ca(context: grpc.aio.ServicerContext) -> x509.Name | None:
    """The issuer of the client's certificate (gRPC has verified it against the held CAs)."""
    pems = (context.auth_context() or {}).get("x509_pem_cert") or []
    if not pems:
        return None
    return x509.load_pem_x509_certificate(pems[0]).issuer


class CheckpointServicer(agent_pb2_grpc.CheckpointServiceServicer):
    """Serves complete checkpoints under ``work_dir``; ``identity`` gives (node_id, probe_key)
    once the node is registered, else None. ``credentials``: the jobs' TLS credentials the port
    is served with; a client's certificate must be of the ticket's job's CA."""

    def __init__(
        self,
        identity: Callable[[], tuple[str, str] | None],
        work_dir: Path,
        credentials: JobCredentials,
    ) -> None:
        self._identity = identity
        self._work_dir = work_dir.resolve()
        self._credentials = credentials
        self._used: dict[str, float] = {}  # transfer_id -> expires_at: one transfer per ticket

    def _check(
        self, t: agent_pb2.CheckpointTicket, peer_ca: x509.Name | None
    ) -> tuple[CheckpointTicket, Path]:
        ident = self._identity()
        if ident is None:
            raise Unauthenticated("this node is not registered yet")
        now = time.time()
        ticket = ticket_from_proto(t)
        verify(ident[1], ident[0], ticket, now)
        # TLS let in a certificate of any job this node holds: it must be of the ticket's job.
        want = self._credentials.ca_name(job_of_dir(ticket.dir))
        if want is None or peer_ca != want:
            raise Unauthenticated("the client's certificate is not of this checkpoint's job")
        for tid in [k for k, exp in self._used.items() if exp <= now]:
            del self._used[tid]
        if ticket.transfer_id in self._used:
            raise Unauthenticated("checkpoint ticket already used")
        self._used[ticket.transfer_id] = ticket.expires_at
        path = self._work_dir / ticket.dir / step_name(ticket.step)
        if not (path / DONE).is_file():
            raise NotFound(f"no complete checkpoint {ticket.dir}/{step_name(ticket.step)} on this node")
        return ticket, path

    async def Fetch(
        self, request: agent_pb2.CheckpointFetchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[agent_pb2.CheckpointChunk]:
        try:
            ticket, path = self._check(request.ticket, _peer_ca(context))
            files = await asyncio.to_thread(manifest, path)
            check_manifest(files, ticket.max_bytes)
        except CpnError as exc:
            await context.abort(_status(exc), exc.message)
        except OSError as exc:  # pruned by the worker while being read
            await context.abort(grpc.StatusCode.NOT_FOUND, f"checkpoint went away while read: {exc}")
        yield agent_pb2.CheckpointChunk(
            manifest=[agent_pb2.CheckpointFile(path=p, size=n, sha256=h) for p, n, h in files]
        )
        try:
            for index, (rel, _, _) in enumerate(files):
                with open(path / rel, "rb") as f:
                    while block := await asyncio.to_thread(f.read, CHUNK_BYTES):
                        yield agent_pb2.CheckpointChunk(file=index, data=block)
        except OSError as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"checkpoint went away while read: {exc}")


def build_checkpoint_server(
    identity: Callable[[], tuple[str, str] | None],
    work_dir: Path,
    credentials: JobCredentials,
    host: str,
    port: int,
) -> tuple[grpc.aio.Server, int]:
    """A bound, not yet started checkpoint server on its own port (``port=0``: a free one), mutual
    TLS only (``JobCredentials.server_credentials``)."""
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", 64 * 1024),  # a request is a ticket
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ],
        maximum_concurrent_rpcs=MAX_CONCURRENT_CALLS,
    )
    agent_pb2_grpc.add_CheckpointServiceServicer_to_server(
        CheckpointServicer(identity, work_dir, credentials), server
    )
    bound = server.add_secure_port(f"{host}:{port}", credentials.server_credentials())
    if bound == 0:
        raise OSError(f"checkpoint server could not bind {host}:{port}")
    return server, bound


class _Receiver:
    """Writes one fetched checkpoint into ``<dir>/step_N.partial`` and checks it."""

    def __init__(self, root: Path, ticket: CheckpointTicket) -> None:
        self.final = root / step_name(ticket.step)
        self.partial = root / f"{step_name(ticket.step)}.partial"
        self.ticket = ticket
        self.files: list[tuple[str, int, str]] = []
        self.hashes: list[hashlib._Hash] = []
        self.written: list[int] = []
        self.handles: dict[int, object] = {}
        self.total = 0

    def start(self, files: list[tuple[str, int, str]]) -> None:
        check_manifest(files, self.ticket.max_bytes)
        shutil.rmtree(self.partial, ignore_errors=True)
        self.partial.mkdir(parents=True)
        self.files = files
        self.hashes = [hashlib.sha256() for _ in files]
        self.written = [0] * len(files)

    def write(self, index: int, data: bytes) -> None:
        if not 0 <= index < len(self.files):
            raise InvalidArgument(f"chunk names file {index} of {len(self.files)}")
        self.written[index] += len(data)
        self.total += len(data)
        if self.written[index] > self.files[index][1]:
            raise InvalidArgument(
                f"{self.files[index][0]}: more bytes than the manifest's {self.files[index][1]}"
            )
        f = self.handles.get(index)
        if f is None:
            target = self.partial / self.files[index][0]
            target.parent.mkdir(parents=True, exist_ok=True)
            f = self.handles[index] = open(target, "wb")  # noqa: SIM115 - closed in finish/abort
        f.write(data)  # type: ignore[attr-defined]
        self.hashes[index].update(data)

    def finish(self) -> int:
        self.close()
        for i, (rel, size, digest) in enumerate(self.files):
            if self.written[i] != size:
                raise InvalidArgument(f"{rel}: {self.written[i]} bytes arrived, the manifest says {size}")
            if self.hashes[i].hexdigest() != digest:
                raise InvalidArgument(f"{rel}: SHA-256 differs from the manifest's")
            if size == 0:  # empty files never get a chunk
                (self.partial / rel).parent.mkdir(parents=True, exist_ok=True)
                (self.partial / rel).touch()
        shutil.rmtree(self.final, ignore_errors=True)
        self.partial.rename(self.final)
        return self.total

    def close(self) -> None:
        for f in self.handles.values():
            f.close()  # type: ignore[attr-defined]
        self.handles.clear()

    def abort(self) -> None:
        self.close()
        shutil.rmtree(self.partial, ignore_errors=True)


def prune_copies(root: Path, keep: int = KEEP_COPIES) -> None:
    """Keep the newest ``keep`` complete steps of a directory the copies land in."""
    done = sorted(d for d in root.glob("step_*") if (d / DONE).is_file() and not d.name.endswith(".partial"))
    for old in done[:-keep]:
        remove_step_dir(old)


def has_checkpoint(work_dir: Path, dir_: str, step: int) -> bool:
    return (work_dir.resolve() / dir_ / step_name(step) / DONE).is_file()


def _channel(target: str, job_id: str, tls: CheckpointTls) -> grpc.aio.Channel:
    """Mutual TLS to a source: its certificate must be of the job's CA and name the job's
    checkpoint server (which the SNI asks for); ours is the job's too."""
    creds = grpc.ssl_channel_credentials(
        root_certificates=tls.ca_pem.encode(),
        private_key=tls.key_pem.encode(),
        certificate_chain=tls.cert_pem.encode(),
    )
    options = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.ssl_target_name_override", checkpoint_server_name(job_id)),
    ]
    return grpc.aio.secure_channel(target, creds, options=options)


async def fetch_checkpoint(
    work_dir: Path, ticket: CheckpointTicket, host: str, port: int, tls: CheckpointTls | None
) -> int:
    """Fetch the ticket's checkpoint from ``host:port`` into the same directory under ``work_dir``,
    over mutual TLS with the job's credentials ``tls``; returns the bytes moved. Raises CpnError
    (bad ticket or data, no credentials) or grpc.aio.AioRpcError."""
    check_dir(ticket.dir)
    if not 0 < port < 65536 or not host:
        raise InvalidArgument(f"source address {host!r}:{port} is not usable")
    if tls is None:  # never in plaintext: a control plane that gave none cannot have the copy
        raise FailedPrecondition(f"no TLS credentials for the checkpoint copy of {ticket.dir}")
    target = f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
    root = work_dir.resolve() / ticket.dir
    receiver = _Receiver(root, ticket)
    budget = max(1.0, min(MAX_TICKET_TTL_S, ticket.expires_at - time.time()))
    channel = _channel(target, job_of_dir(ticket.dir), tls)
    try:
        stub = agent_pb2_grpc.CheckpointServiceStub(channel)
        call = stub.Fetch(agent_pb2.CheckpointFetchRequest(ticket=ticket_to_proto(ticket)), timeout=budget)
        started = False
        async for chunk in call:
            if not started:
                files = [(f.path, f.size, f.sha256) for f in chunk.manifest]
                await asyncio.to_thread(receiver.start, files)
                started = True
                continue
            if receiver.total + len(chunk.data) > ticket.max_bytes:
                raise InvalidArgument(f"more than the ticket's {ticket.max_bytes} bytes arrived")
            await asyncio.to_thread(receiver.write, chunk.file, chunk.data)
        if not started:
            raise InvalidArgument("the source sent no manifest")
        total = await asyncio.to_thread(receiver.finish)
    except BaseException:
        receiver.abort()
        raise
    finally:
        await channel.close(grace=None)
    await asyncio.to_thread(prune_copies, root)
    return total


async def run_copy(
    work_dir: Path, ticket: CheckpointTicket, host: str, port: int, tls: CheckpointTls | None
) -> tuple[int, float, str]:
    """``fetch_checkpoint`` with failures as text: (bytes, seconds, error or "")."""
    t0 = time.perf_counter()
    try:
        n = await fetch_checkpoint(work_dir, ticket, host, port, tls)
        return n, time.perf_counter() - t0, ""
    except CpnError as exc:
        return 0, time.perf_counter() - t0, exc.message[:500]
    except grpc.aio.AioRpcError as exc:
        return 0, time.perf_counter() - t0, f"{host}:{port}: {exc.code().name} {exc.details()}"[:500]
    except OSError as exc:
        return 0, time.perf_counter() - t0, f"writing the copy failed: {exc}"[:500]
