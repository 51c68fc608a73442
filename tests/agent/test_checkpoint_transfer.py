"""Checkpoint copies between two nodes: a real CheckpointService on loopback (on the probe server, as
the agent runs it) and the fetch the receiving agent runs; tickets, bounds and integrity checks."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from agent.checkpoint_transfer import MAX_MESSAGE_BYTES as CHECKPOINT_MESSAGE_BYTES
from agent.checkpoint_transfer import (
    CheckpointServicer,
    add_checkpoint_service,
    fetch_checkpoint,
    run_copy,
    step_name,
)
from agent.probe import build_probe_server
from agent.settings import AgentSettings
from agent.workers import Assignment, WorkerRun
from contracts.checkpoint_transfer import CheckpointTicket, checkpoint_bytes_bound, sign
from contracts.errors import InvalidArgument
from contracts.link_probe import new_probe_key
from proto.cpn.agent.v1 import agent_pb2, agent_pb2_grpc

DIR = "checkpoints/job1/eu-west"
NODE = "node-src"


def write_checkpoint(work_dir: Path, step: int, sizes: dict[str, int], complete: bool = True) -> Path:
    d = work_dir / DIR / step_name(step)
    d.mkdir(parents=True)
    for rel, n in sizes.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(os.urandom(n))
    if complete:
        (d / "COMPLETE").write_text(str(step))
    return d


def ticket(
    key: str, step: int, max_bytes: int = 1 << 30, tid: str = "t1", ttl: float = 120
) -> CheckpointTicket:
    return sign(key, CheckpointTicket(tid, NODE, DIR, step, max_bytes, float(int(time.time() + ttl))))


async def _serve(work_dir: Path, key: str, servicer: type[CheckpointServicer] = CheckpointServicer):
    def extra(server: grpc.aio.Server) -> None:
        if servicer is CheckpointServicer:
            add_checkpoint_service(server, lambda: (NODE, key), work_dir)
        else:
            agent_pb2_grpc.add_CheckpointServiceServicer_to_server(
                servicer(lambda: (NODE, key), work_dir), server
            )

    server, port = build_probe_server(
        lambda: (NODE, key), "127.0.0.1", 0, extra=extra, max_send_bytes=CHECKPOINT_MESSAGE_BYTES
    )
    await server.start()
    return server, port


def test_a_copy_lands_byte_identical_and_complete(tmp_path: Path) -> None:
    src, dst, key = tmp_path / "src", tmp_path / "dst", new_probe_key()
    sizes = {"__0_0.distcp": 3 * 1024 * 1024 + 17, "meta.pt": 2000, ".metadata": 0, "sub/extra.bin": 5}
    for step in (10, 20, 30):  # the receiver keeps its newest two
        write_checkpoint(src, step, sizes)

    async def go() -> list[int]:
        server, port = await _serve(src, key)
        try:
            return [
                await fetch_checkpoint(dst, ticket(key, s, tid=f"t{s}"), "127.0.0.1", port)
                for s in (10, 20, 30)
            ]
        finally:
            await server.stop(0)

    moved = asyncio.run(go())
    total = sum(sizes.values()) + 2  # COMPLETE holds "30" (or "10", "20")
    assert moved == [total, total, total]
    assert sorted(p.name for p in (dst / DIR).iterdir()) == [step_name(20), step_name(30)]
    got, want = dst / DIR / step_name(30), src / DIR / step_name(30)
    for rel in [*sizes, "COMPLETE"]:
        assert (got / rel).read_bytes() == (want / rel).read_bytes(), rel


def test_tickets_are_checked_and_bounds_refused(tmp_path: Path) -> None:
    src, dst, key = tmp_path / "src", tmp_path / "dst", new_probe_key()
    write_checkpoint(src, 5, {"a.distcp": 200_000})
    write_checkpoint(src, 6, {"a.distcp": 10}, complete=False)  # an interrupted save

    async def go() -> dict[str, tuple[int, str]]:
        server, port = await _serve(src, key)
        out = {}
        try:
            cases = {
                "other key": ticket(new_probe_key(), 5, tid="a"),
                "good": ticket(key, 5, tid="b"),
                "replay": ticket(key, 5, tid="b"),
                "too big": ticket(key, 5, max_bytes=100_000, tid="c"),
                "incomplete": ticket(key, 6, tid="d"),
                "expired": ticket(key, 5, tid="e", ttl=-5),
            }
            for name, t in cases.items():
                n, _, error = await run_copy(dst, t, "127.0.0.1", port)
                out[name] = (n, error)
        finally:
            await server.stop(0)
        return out

    out = asyncio.run(go())
    assert out["good"][0] > 200_000 and out["good"][1] == ""
    assert "UNAUTHENTICATED" in out["other key"][1]
    assert "UNAUTHENTICATED" in out["replay"][1] and "already used" in out["replay"][1]
    assert "INVALID_ARGUMENT" in out["too big"][1] and "exceed" in out["too big"][1]
    assert "NOT_FOUND" in out["incomplete"][1]
    assert "UNAUTHENTICATED" in out["expired"][1]
    assert not list((dst / DIR).glob("*.partial"))  # refused transfers leave nothing behind
    with pytest.raises(InvalidArgument):  # the control plane cannot sign a path out of the work dir
        sign(key, CheckpointTicket("x", NODE, "checkpoints/../../etc", 1, 10, time.time() + 60))
    assert checkpoint_bytes_bound(1_000_000) == 24_000_000 + 64 * 1024 * 1024


class Tampering(CheckpointServicer):
    """A source whose data differs from its manifest (a disk or wire fault, or a hostile node)."""

    async def Fetch(
        self, request: agent_pb2.CheckpointFetchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[agent_pb2.CheckpointChunk]:
        first = True
        async for chunk in super().Fetch(request, context):
            if not first and chunk.data:
                chunk = agent_pb2.CheckpointChunk(
                    file=chunk.file, data=bytes([chunk.data[0] ^ 1]) + chunk.data[1:]
                )
            first = False
            yield chunk


def test_a_copy_that_differs_from_its_manifest_is_never_kept(tmp_path: Path) -> None:
    src, dst, key = tmp_path / "src", tmp_path / "dst", new_probe_key()
    write_checkpoint(src, 7, {"a.distcp": 50_000})

    async def go() -> tuple[int, float, str]:
        server, port = await _serve(src, key, Tampering)
        try:
            return await run_copy(dst, ticket(key, 7), "127.0.0.1", port)
        finally:
            await server.stop(0)

    n, _, error = asyncio.run(go())
    assert n == 0 and "SHA-256 differs" in error
    assert not (dst / DIR / step_name(7)).exists() and not list((dst / DIR).glob("*.partial"))


def test_an_assignment_fetches_its_checkpoint_before_its_workers_start(tmp_path: Path) -> None:
    """A real WorkerRun: the agent fetches the checkpoint its config names, reports it, and only
    then starts the workers (here a test command that fails unless the copy is in place)."""
    src, dst, key = tmp_path / "src", tmp_path / "dst", new_probe_key()
    write_checkpoint(src, 30, {"a.distcp": 300_000, "meta.pt": 100})
    sent: list[agent_pb2.AgentMessage] = []
    done = dst / DIR / step_name(30) / "COMPLETE"
    check = f"import pathlib, sys; sys.exit(0 if pathlib.Path({str(done)!r}).is_file() else 3)"

    async def go(spec: dict) -> WorkerRun:
        server, port = await _serve(src, key)
        try:
            config = {"job_id": "job1", "checkpoint": {"dir": DIR, "fetch": spec | {"port": port}}}
            config["command"] = [sys.executable, "-c", check]
            a = Assignment("task-1", "job1", 1, (0,), 1, config)
            s = AgentSettings(
                server="127.0.0.1:50051", region="eu-west", cluster="paris-1", price_per_device_hour=1.0,
                work_dir=dst, allow_command_override=True,
            )  # fmt: skip
            run = WorkerRun(
                a, dst / "assignments" / "task-1", settings=s, device_kind="cpu", send=sent.append
            )
            await run.run()
            return run
        finally:
            await server.stop(0)

    t = ticket(key, 30, tid="fetch-1")
    spec = {
        "transfer_id": t.transfer_id, "source_node_id": t.source_node_id, "dir": t.dir, "step": t.step,
        "max_bytes": t.max_bytes, "expires_at": t.expires_at, "mac": t.mac, "host": "127.0.0.1",
    }  # fmt: skip
    run = asyncio.run(go(spec))
    kinds = [m.WhichOneof("kind") for m in sent]
    running = next(
        i
        for i, m in enumerate(sent)
        if kinds[i] == "task_status" and m.task_status.state == agent_pb2.TASK_STATE_RUNNING
    )
    assert kinds.index("checkpoint_copy_result") < running  # fetched before the workers started
    (result,) = [m.checkpoint_copy_result for m in sent if m.WhichOneof("kind") == "checkpoint_copy_result"]
    assert (result.transfer_id, result.assignment_id, result.error) == ("fetch-1", "task-1", "")
    assert result.bytes == 300_000 + 100 + 2
    assert run.current.task_status.state == agent_pb2.TASK_STATE_SUCCEEDED, run.current.task_status.message
