"""Checkpoint copies between two nodes: a real CheckpointService on loopback (on its own mutual-TLS
port, as the agent runs it) and the fetch the receiving agent runs; tickets, bounds, integrity,
and the job's credentials on both ends."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from agent.checkpoint_transfer import (
    CheckpointServicer,
    JobCredentials,
    build_checkpoint_server,
    fetch_checkpoint,
    run_copy,
    step_name,
    ticket_to_proto,
)
from agent.settings import AgentSettings
from agent.workers import Assignment, WorkerRun
from contracts.checkpoint_transfer import CheckpointTicket, CheckpointTls, checkpoint_bytes_bound, sign
from contracts.errors import FailedPrecondition, InvalidArgument
from contracts.link_probe import new_probe_key
from orchestration.sync_tls import checkpoint_credentials
from proto.cpn.agent.v1 import agent_pb2, agent_pb2_grpc

DIR = "checkpoints/job1/eu-west"
NODE = "node-src"
SECRET = "a-job-sync-secret"  # the control plane's, for job1 and job2 here


def creds(job: str, holder: str) -> CheckpointTls:
    """What the control plane gives a node for a job's copies (``control_layer.allocation``)."""
    return CheckpointTls(**checkpoint_credentials(SECRET, job, holder))


SRC_TLS, DST_TLS = creds("job1", NODE), creds("job1", "node-dst")


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


async def _serve(
    work_dir: Path, key: str, servicer: type[CheckpointServicer] = CheckpointServicer, **held: CheckpointTls
) -> tuple[grpc.aio.Server, int]:
    """The source's checkpoint server, holding job1's credentials (and ``held``: job id -> more)."""
    credentials = JobCredentials(work_dir)
    for job, tls in {"job1": SRC_TLS, **held}.items():
        credentials.add(job, tls)
    server, port = build_checkpoint_server(lambda: (NODE, key), work_dir, credentials, "127.0.0.1", 0)
    if servicer is not CheckpointServicer:  # the same port and credentials, another servicer
        server = grpc.aio.server()
        agent_pb2_grpc.add_CheckpointServiceServicer_to_server(
            servicer(lambda: (NODE, key), work_dir, credentials), server
        )
        port = server.add_secure_port("127.0.0.1:0", credentials.server_credentials())
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
                await fetch_checkpoint(dst, ticket(key, s, tid=f"t{s}"), "127.0.0.1", port, DST_TLS)
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
                n, _, error = await run_copy(dst, t, "127.0.0.1", port, DST_TLS)
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
            return await run_copy(dst, ticket(key, 7), "127.0.0.1", port, DST_TLS)
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
            fetch = spec | {"port": port}
            config = {"job_id": "job1", "checkpoint": {"dir": DIR, "fetch": fetch, "tls": DST_TLS.as_dict()}}
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
    written = (dst / "assignments" / "task-1" / "worker_config.json").read_text()
    assert "tls" not in json.loads(written)["checkpoint"]  # the agent's credentials, not the worker's


def test_only_the_jobs_own_credentials_get_a_copy_and_never_in_plaintext(tmp_path: Path) -> None:
    """The port speaks mutual TLS only: a plaintext client, a client without a certificate, one
    that trusts another CA, and one holding another job's credentials (which the source also holds,
    so TLS lets it in) are all refused, each with a valid ticket; a fetch without credentials is
    never tried in plaintext."""
    src, dst, key = tmp_path / "src", tmp_path / "dst", new_probe_key()
    write_checkpoint(src, 5, {"a.distcp": 1000})
    theirs = creds("job2", "node-dst")  # a node of another job, which knows job1's CA (no secret)
    job2 = CheckpointTls(SRC_TLS.ca_pem, theirs.cert_pem, theirs.key_pem)
    no_cert = CheckpointTls(DST_TLS.ca_pem, "", "")

    async def plaintext(port: int) -> str:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = agent_pb2_grpc.CheckpointServiceStub(channel).Fetch(
                agent_pb2.CheckpointFetchRequest(ticket=ticket_to_proto(ticket(key, 5, tid="p"))), timeout=5
            )
            try:
                async for _ in call:
                    return "got data"
            except grpc.aio.AioRpcError as exc:
                return exc.code().name
        return "nothing"

    async def go() -> dict[str, str]:
        server, port = await _serve(src, key, job2=creds("job2", NODE))
        try:
            out = {"plaintext": await plaintext(port)}
            tries = {"no cert": no_cert, "other job": job2, "other CA": creds("job2", "x"), "good": DST_TLS}
            for name, tls in tries.items():
                out[name] = (await run_copy(dst, ticket(key, 5, tid=name), "127.0.0.1", port, tls))[2]
            with pytest.raises(FailedPrecondition):
                await fetch_checkpoint(dst, ticket(key, 5, tid="none"), "127.0.0.1", port, None)
            return out
        finally:
            await server.stop(0)

    out = asyncio.run(go())
    assert out["plaintext"] == "UNAVAILABLE"  # no TLS handshake, no call
    assert "UNAVAILABLE" in out["no cert"]  # the source requires a client certificate
    assert "UNAUTHENTICATED" in out["other job"] and "not of this checkpoint's job" in out["other job"]
    assert "UNAVAILABLE" in out["other CA"]  # the source's certificate is not of the CA it trusts
    assert out["good"] == ""


def test_a_nodes_job_credentials_outlive_the_agent_and_leave_with_the_job(tmp_path: Path) -> None:
    held = JobCredentials(tmp_path)
    held.add("job1", SRC_TLS)
    path = tmp_path / "checkpoint-tls" / "job1.json"
    assert path.stat().st_mode & 0o777 == 0o600
    again = JobCredentials(tmp_path)  # a restarted agent serves what it held
    assert again.get("job1") == SRC_TLS and again.ca_name("job1") is not None
    again.keep_only({"job9"})
    assert again.get("job1") is None and not path.exists()
    with pytest.raises(InvalidArgument):
        held.add("../etc", SRC_TLS)
