"""A lean load generator for ``POST /v1/jobs``: raw HTTP/1.1 over keep-alive asyncio streams.

It runs in processes of its own (``run_clients``) so that the cost of generating load is not taken
from the server it measures, and reports the CPU it used. Each connection sends one request at a
time and waits for its answer (no pipelining: a submission's latency is then request to answer).
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import time
from dataclasses import dataclass, field
from typing import Any

from contracts.lifetime import die_with_parent


@dataclass
class ClientResult:
    latencies_s: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    job_ids: int = 0  # answers that carried a job id
    cpu_s: float = 0.0  # CPU the client processes used while sending
    first_error: str = ""


def _request(host: str, port: int, key: str, body: bytes) -> bytes:
    head = (
        f"POST /v1/jobs HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _read_answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    return status, await reader.readexactly(length)


async def _load(
    targets: list[tuple[str, int]], key: str, body: bytes, connections: int, seconds: float
) -> ClientResult:
    out = ClientResult()
    end = time.monotonic() + seconds

    async def connection(i: int) -> None:
        host, port = targets[i % len(targets)]
        request = _request(host, port, key, body)
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while time.monotonic() < end:
                t = time.perf_counter()
                writer.write(request)
                status, answer = await _read_answer(reader)
                out.latencies_s.append(time.perf_counter() - t)
                out.statuses[status] = out.statuses.get(status, 0) + 1
                if status == 201 and b'"id":"' in answer:
                    out.job_ids += 1
                elif not out.first_error:
                    out.first_error = f"{status}: {answer[:300]!r}"
        finally:
            writer.close()

    await asyncio.gather(*(connection(i) for i in range(connections)))
    return out


def _client_process(
    targets: list[tuple[str, int]], key: str, body: bytes, connections: int, seconds: float,
    ready: Any, start: Any, results: Any,
) -> None:  # fmt: skip
    die_with_parent(mp.parent_process().pid)  # type: ignore[union-attr]  # a spawned child has one
    ready.release()
    start.wait()
    cpu0 = time.process_time()
    out = asyncio.run(_load(targets, key, body, connections, seconds))
    out.cpu_s = time.process_time() - cpu0
    results.put(out)


def run_clients(
    targets: list[tuple[str, int]], key: str, body: bytes, connections: int, seconds: float, procs: int = 1
) -> tuple[ClientResult, float]:
    """``connections`` keep-alive connections spread over ``procs`` processes and over ``targets``
    (round robin), sending for ``seconds``. Returns the merged result and the wall time from the
    start signal until the last process answered."""
    ctx = mp.get_context("spawn")
    ready, start, results = ctx.Semaphore(0), ctx.Event(), ctx.Queue()
    shares = [connections // procs + (1 if i < connections % procs else 0) for i in range(procs)]
    workers = [
        ctx.Process(
            target=_client_process,
            args=(targets[i:] + targets[:i], key, body, n, seconds, ready, start, results),
        )
        for i, n in enumerate(shares)
        if n > 0
    ]
    for w in workers:
        w.start()
    for _ in workers:  # every process at the start line (their start-up is not what is measured)
        ready.acquire()
    t0 = time.monotonic()
    start.set()
    merged = ClientResult()
    for _ in workers:
        part: ClientResult = results.get(timeout=seconds + 120)
        merged.latencies_s += part.latencies_s
        for status, n in part.statuses.items():
            merged.statuses[status] = merged.statuses.get(status, 0) + n
        merged.job_ids += part.job_ids
        merged.cpu_s += part.cpu_s
        merged.first_error = merged.first_error or part.first_error
    elapsed = time.monotonic() - t0
    for w in workers:
        w.join(30)
    return merged, elapsed
