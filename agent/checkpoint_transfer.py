"""Checkpoint copies between the nodes of a region: the CheckpointService an agent serves, and the
fetch it runs on the control plane's orders (a copy after a checkpoint completes, or before
launching a task re-placed on a node that lacks its checkpoint).

The source streams a manifest (every file's size and SHA-256) and then the files; the receiver
writes into ``step_N.partial`` under the same directory of its own work dir, checks every size and
hash, and renames the directory into place only when all agree, so an interrupted or corrupt copy
is never resumed from (``training.checkpoint`` resumes only from ``step_N`` with ``COMPLETE``).
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc

from contracts.checkpoint_transfer import (
    CHUNK_BYTES,
    MAX_TICKET_TTL_S,
    CheckpointTicket,
    check_dir,
    check_manifest,
    verify,
)
from contracts.errors import CpnError, InvalidArgument, NotFound, Unauthenticated
from proto.cpn.agent.v1 import agent_pb2, agent_pb2_grpc

DONE = "COMPLETE"  # training.checkpoint's marker of a complete save
KEEP_COPIES = 2  # complete steps a receiver keeps per directory (training.checkpoint's keep_last)
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


class CheckpointServicer(agent_pb2_grpc.CheckpointServiceServicer):
    """Serves complete checkpoints under ``work_dir``; ``identity`` gives (node_id, probe_key)
    once the node is registered, else None."""

    def __init__(self, identity: Callable[[], tuple[str, str] | None], work_dir: Path) -> None:
        self._identity = identity
        self._work_dir = work_dir.resolve()
        self._used: dict[str, float] = {}  # transfer_id -> expires_at: one transfer per ticket

    def _check(self, t: agent_pb2.CheckpointTicket) -> tuple[CheckpointTicket, Path]:
        ident = self._identity()
        if ident is None:
            raise Unauthenticated("this node is not registered yet")
        now = time.time()
        ticket = ticket_from_proto(t)
        verify(ident[1], ident[0], ticket, now)
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
            ticket, path = self._check(request.ticket)
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


def add_checkpoint_service(
    server: grpc.aio.Server, identity: Callable[[], tuple[str, str] | None], work_dir: Path
) -> None:
    agent_pb2_grpc.add_CheckpointServiceServicer_to_server(CheckpointServicer(identity, work_dir), server)


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
        shutil.rmtree(old, ignore_errors=True)


def has_checkpoint(work_dir: Path, dir_: str, step: int) -> bool:
    return (work_dir.resolve() / dir_ / step_name(step) / DONE).is_file()


async def fetch_checkpoint(work_dir: Path, ticket: CheckpointTicket, host: str, port: int) -> int:
    """Fetch the ticket's checkpoint from ``host:port`` into the same directory under ``work_dir``;
    returns the bytes moved. Raises CpnError (bad ticket or data) or grpc.aio.AioRpcError."""
    check_dir(ticket.dir)
    if not 0 < port < 65536 or not host:
        raise InvalidArgument(f"source address {host!r}:{port} is not usable")
    target = f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
    root = work_dir.resolve() / ticket.dir
    receiver = _Receiver(root, ticket)
    budget = max(1.0, min(MAX_TICKET_TTL_S, ticket.expires_at - time.time()))
    channel = grpc.aio.insecure_channel(
        target, options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
    )
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


async def run_copy(work_dir: Path, ticket: CheckpointTicket, host: str, port: int) -> tuple[int, float, str]:
    """``fetch_checkpoint`` with failures as text: (bytes, seconds, error or "")."""
    t0 = time.perf_counter()
    try:
        n = await fetch_checkpoint(work_dir, ticket, host, port)
        return n, time.perf_counter() - t0, ""
    except CpnError as exc:
        return 0, time.perf_counter() - t0, exc.message[:500]
    except grpc.aio.AioRpcError as exc:
        return 0, time.perf_counter() - t0, f"{host}:{port}: {exc.code().name} {exc.details()}"[:500]
    except OSError as exc:
        return 0, time.perf_counter() - t0, f"writing the copy failed: {exc}"[:500]
