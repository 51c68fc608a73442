"""Admission under a burst: 200 concurrent submissions for scarce devices, on PostgreSQL + Redis.

    python benchmarks/admission.py [--submissions 200] [--steps 3] [--in-flight 0] [--drain-timeout 3600]
                                   [--workers N]

A `cpn server` deployed as docs/operations.md advises, one worker per core (`--workers`,
default the cores this machine has, at most 4), on a fresh PostgreSQL database and Redis (as
`benchmarks/control_plane.py` starts one), two real `cpn agent` processes of two CPU slots each
(four devices in all), and two tenants. Each tenant submits half the jobs: a tiny GPT of a few steps
on one device, one in four of each tenant's at priority 1, the rest at 0. Concurrency: one asyncio
event loop in a process of its own, raw HTTP/1.1 over asyncio streams (``_submit_client.py``'s
request and answer code; with httpx at 200 connections the client, not the server, set the pace),
one keep-alive connection per submission, opened and its key verified first (so no answer waits on a
TCP handshake), and every submission started at once with ``asyncio.gather``: all 200 are in flight
together (``--in-flight N`` caps them at N, each next one sent as one is answered). A submission's
latency runs from writing the request to reading the whole answer.

Then it waits until every job has ended and reads the database: double bookings (two active
spans of allocations of one device that overlap in time), the queue wait per tenant and priority,
and the ledger's balance (the sum of every posting's signed amount). Prints a table and ends with
one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _host import patience  # noqa: E402
from _submit_client import _read_answer, _request  # noqa: E402
from control_plane import Database, Replica, admin_client, server_env  # noqa: E402

from orchestration.db.engine import as_utc  # noqa: E402
from orchestration.db.models import Allocation, Job, LedgerPosting  # noqa: E402
from service_layer.cli.demo import wait_for_clusters  # noqa: E402
from service_layer.cli.local_fleet import LocalAgent, enroll, start_agents, stop_agents  # noqa: E402

TERMINAL = ("succeeded", "failed", "cancelled")
AGENTS = [
    LocalAgent("eu-west", "paris-1", "lumen", 1.0, "EU", devices="cpu:2", measure_profile=False),
    LocalAgent("eu-west", "paris-2", "lumen", 1.2, "EU", devices="cpu:2", measure_profile=False),
]


def job_spec(i: int, steps: int, priority: int) -> dict[str, Any]:
    """One device, a few steps of a 1-layer GPT: the jobs are many and short, the devices few."""
    return {
        "name": f"adm-{i:03d}",
        "model": {"family": "gpt", "n_layers": 1, "d_model": 32, "n_heads": 2, "vocab": 32, "seq_len": 32},
        "data": {"kind": "synthetic-markov", "seed": i},
        "training": {"steps": steps, "global_batch_tokens": 4 * 32, "lr": 3e-3},
        "parallelism": {"dp": 1, "tp": 1, "pp": 1, "zero": 0},
        "sync": {"mode": "sync"},
        "qos": {"max_hours": 1, "objective": "cost", "priority": priority},
    }


async def _open(port: int, key: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A keep-alive connection, its key verified once (so the burst measures submissions alone)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET /v1/queue HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n".encode())
    status, _ = await _read_answer(reader)
    if status != 200:
        raise RuntimeError(f"warm-up answered {status}")
    return reader, writer


async def burst(
    port: int, keys: list[str], n: int, steps: int, in_flight: int, cpu_s: Callable[[], float]
) -> tuple[list[float], list[dict[str, Any]], list[str], float, float]:
    """Every submission in flight at once, one connection each; returns latencies (s), 201
    answers, other answers, the seconds from the first request sent to the last answer read, and
    the server's CPU seconds meanwhile (``cpu_s`` reads its counter)."""
    conns = await asyncio.gather(*(_open(port, keys[i % len(keys)]) for i in range(n)))
    # tenants alternate; each tenant's every fourth job is urgent
    requests = [
        _request(
            "127.0.0.1",
            port,
            keys[i % len(keys)],
            json.dumps({"spec": job_spec(i, steps, 1 if (i // 2) % 4 == 0 else 0)}).encode(),
        )
        for i in range(n)
    ]
    latencies: list[float] = []
    answers: list[dict[str, Any]] = []
    errors: list[str] = []
    gate = asyncio.Semaphore(in_flight)

    async def submit(i: int) -> None:
        reader, writer = conns[i]
        async with gate:
            start = time.perf_counter()
            writer.write(requests[i])
            status, body = await _read_answer(reader)
            latencies.append(time.perf_counter() - start)
        if status == 201:
            answers.append(json.loads(body))
        else:
            errors.append(f"{status} {body[:200]!r}")

    try:
        start, cpu0 = time.perf_counter(), cpu_s()
        await asyncio.gather(*(submit(i) for i in range(n)))
        return latencies, answers, errors, time.perf_counter() - start, cpu_s() - cpu0
    finally:
        for _, writer in conns:
            writer.close()


def double_bookings(db: Database) -> int:
    """Pairs of allocations of one device whose spans overlap (a span runs from creation to
    release, or to now while active)."""
    with db.sessions() as s:
        rows = s.execute(
            select(Allocation.accelerator_id, Allocation.created_at, Allocation.released_at).order_by(
                Allocation.accelerator_id, Allocation.created_at
            )
        ).all()
    far = datetime.max.replace(tzinfo=as_utc(rows[0][1]).tzinfo) if rows else None
    spans: dict[str, list[tuple[datetime, datetime]]] = defaultdict(list)
    for acc, created, released in rows:
        spans[acc].append((as_utc(created), as_utc(released) if released else far))
    overlaps = 0
    for items in spans.values():
        for i, (_start, end) in enumerate(items):
            overlaps += sum(1 for other_start, _ in items[i + 1 :] if other_start < end)
    return overlaps


def ledger_sum(db: Database) -> float:
    """The sum of every posting's signed amount (debits positive, credits negative): 0.0 when every
    transaction balances."""
    with db.sessions() as s:
        micros = s.scalar(select(func.coalesce(func.sum(LedgerPosting.amount_micros), 0))) or 0
    return int(micros) / 1e6 + 0.0  # + 0.0: never -0.0


def quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--submissions", type=int, default=200)
    ap.add_argument("--steps", type=int, default=3, help="Training steps of every job")
    ap.add_argument(
        "--in-flight", type=int, default=0, help="At most this many submissions at once (0: all of them)"
    )
    ap.add_argument(
        "--drain-timeout",
        type=float,
        default=3600.0,
        help="Seconds to wait for every job (× the host's pace)",
    )
    ap.add_argument(
        "--workers",
        type=int,
        default=min(4, len(os.sched_getaffinity(0))),
        help="`cpn server --workers`: server processes (default: one per core, at most 4)",
    )
    args = ap.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="cpn-admission-"))
    (workdir / "logs").mkdir()
    db = Database()
    admin_key = "cpn_admin_" + secrets.token_urlsafe(16)
    replica = Replica(
        "r1", server_env(db, workdir, admin_key), workdir / "logs", args=["--workers", str(args.workers)]
    )
    agents = []
    try:
        replica.start()
        admin = admin_client(replica, admin_key)
        agents = start_agents(AGENTS, replica.grpc_target, enroll(admin, AGENTS, "admission"), workdir, 33500)
        wait_for_clusters(admin, len(AGENTS), timeout_s=patience(300.0))
        keys, tenant_names = [], {}
        for name in ("alice", "bob"):
            tenant = admin.post("/v1/tenants", json={"name": name}).raise_for_status().json()
            keys.append(admin.post(f"/v1/tenants/{tenant['id']}/keys").raise_for_status().json()["key"])
            tenant_names[tenant["id"]] = name

        began = time.monotonic()
        in_flight = args.in_flight or args.submissions
        latencies, answers, errors, burst_s, server_cpu_s = asyncio.run(
            burst(replica.http_port, keys, args.submissions, args.steps, in_flight, replica.cpu_s)
        )
        queued_at_submit = sum(a["status"] == "queued" and a.get("queue") is not None for a in answers)
        queue_after = admin.get("/v1/queue").raise_for_status().json()
        print(
            f"burst: {len(answers)} answered 201 in {burst_s:.2f}s, {len(errors)} other answers; "
            f"{len(queue_after)} queued just after",
            file=sys.stderr,
            flush=True,
        )
        ids = {a["id"] for a in answers}
        drain_ceiling = patience(args.drain_timeout)
        deadline = time.monotonic() + drain_ceiling
        while True:
            jobs = admin.get("/v1/jobs", params={"limit": 1000}).raise_for_status().json()
            mine = [j for j in jobs if j["id"] in ids]
            done = sum(j["status"] in TERMINAL for j in mine)
            if done == len(ids):
                break
            if time.monotonic() > deadline:
                print(
                    f"  drain: {done}/{len(ids)} ended within {drain_ceiling:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )
                break
            print(f"  {done}/{len(ids)} ended", file=sys.stderr, flush=True)
            time.sleep(5)
        drain_s = time.monotonic() - began
        bookings = double_bookings(db)
        balance = ledger_sum(db)
        admin.close()
    finally:
        stop_agents(agents)
        replica.stop()

    with db.sessions() as s:
        rows = s.execute(
            select(Job.tenant_id, Job.priority, Job.status, Job.created_at, Job.started_at).where(
                Job.id.in_(list(ids))
            )
        ).all()
    db.drop()

    groups: dict[tuple[str, int], list[Any]] = defaultdict(list)
    for tenant_id, priority, status, created, started in rows:
        groups[(tenant_names.get(tenant_id, tenant_id), priority)].append((status, created, started))
    head = f"{'tenant':<7} {'prio':>4} {'jobs':>5} {'ok':>5}"
    print(f"{head} {'wait p50 s':>10} {'wait p90 s':>10} {'wait max s':>10}")
    for (name, priority), items in sorted(groups.items(), key=lambda kv: (-kv[0][1], kv[0][0])):
        waits = [(as_utc(st) - as_utc(cr)).total_seconds() for _, cr, st in items if st is not None]
        print(
            f"{name:<7} {priority:>4} {len(items):>5} {sum(x[0] == 'succeeded' for x in items):>5} "
            f"{quantile(waits, 0.5):>10.1f} {quantile(waits, 0.9):>10.1f} {max(waits, default=0):>10.1f}"
        )
    lat_ms = [x * 1000 for x in latencies]
    print(
        f"submit latency ms: p50 {quantile(lat_ms, 0.5):.1f}, p90 {quantile(lat_ms, 0.9):.1f}, "
        f"p99 {quantile(lat_ms, 0.99):.1f}, max {max(lat_ms):.1f}; burst {burst_s:.2f}s, "
        f"server CPU {server_cpu_s:.2f}s ({server_cpu_s / max(1, len(latencies)) * 1000:.1f} ms each); "
        f"every job ended after {drain_s:.0f}s"
    )
    print(
        json.dumps(
            {
                "submissions": args.submissions,
                "queued": queued_at_submit,
                "failed_at_submit": args.submissions
                - len(answers)
                + sum(a["status"] == "failed" for a in answers),
                "double_bookings": bookings,
                "submit_p99_ms": round(quantile(lat_ms, 0.99), 1),
                "all_eventually_ran": len(rows) == args.submissions
                and all(status == "succeeded" for _, _, status, _, _ in rows),
                "ledger_sum": balance,
            }
        )
    )


if __name__ == "__main__":
    main()
