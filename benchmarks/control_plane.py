"""The control plane under load and under chaos, on PostgreSQL + Redis, as `cpn server` processes.

1. Heartbeats: simulated agents (several client processes) register over gRPC and hold real
   ``Connect`` streams, each sending heartbeats as fast as its stream takes them; the figure is
   what the server counted as ingested (``cpn_heartbeats_total`` on /metrics) per second.
2. Submissions: keep-alive connections POST /v1/jobs for a while, from a lean raw-HTTP client in a
   process of its own (``_submit_client.py``; its CPU is reported), spread over ``--replicas``
   replicas on the one PostgreSQL + Redis (the leader among them also runs the placer, which
   rejects each job: no cluster is in its region). Submissions/s across the replicas, the p99 of
   their latency, and a check that every 201 answer is a stored job.
3. Chaos, with real `cpn agent` processes and real training jobs:
   - restart: one replica, killed with SIGKILL while jobs train, started again on the same database;
   - failover: two replicas, the leader killed with SIGKILL while jobs train. ``failover_s`` runs
     from the kill until the survivor leads and every agent's stream is back on it.
   A job is lost if it does not succeed on its first attempt with every task succeeded,
   duplicated if it got more tasks than its plan or stored a metric step twice, stuck if it is
   not finished in time.
4. Stranded processes: runs killed with SIGKILL, each with a mark in its environment that every
   process it starts inherits: a `cpn server --workers 2` (its supervisor) and two `cpn agent`
   processes training a job (torchrun and its ranks, each rank in a session of its own), then a
   `cpn demo` while its agents measure their reference steps. ``stranded_processes`` counts the
   processes of those runs still alive once the killed parents are gone (it waits up to 30 s for
   the last; target 0).

    python benchmarks/control_plane.py            # full run (about 6 minutes)
    python benchmarks/control_plane.py --quick    # shorter load phases, one job per chaos phase
    python benchmarks/control_plane.py --only-stranded   # phase 4 alone (about a minute)
    python benchmarks/control_plane.py --busy 2   # every phase beside 2 CPU-bound loops

Prints a table and a final JSON line. Needs PostgreSQL and Redis (CPN_BENCH_POSTGRES_URL,
CPN_BENCH_REDIS_URL; local defaults).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _host import patience  # noqa: E402
from _submit_client import run_clients  # noqa: E402

from contracts.lifetime import die_with_parent, tied_env  # noqa: E402
from orchestration.bus import RedisBus, default_prefix  # noqa: E402
from orchestration.db.base import utcnow  # noqa: E402
from orchestration.db.engine import as_utc, make_engine, make_session_factory, normalize_url  # noqa: E402
from orchestration.db.migrate import upgrade  # noqa: E402
from orchestration.db.models import Job, LeaderLease, Node, Task, TaskMetric  # noqa: E402
from orchestration.leadership import SINGLETONS  # noqa: E402
from orchestration.settings import Settings  # noqa: E402
from proto.cpn.agent.v1 import agent_pb2, agent_pb2_grpc  # noqa: E402
from service_layer.cli.demo import wait_for_clusters  # noqa: E402
from service_layer.cli.local_fleet import LocalAgent, enroll, start_agents, stop_agents  # noqa: E402

POSTGRES = os.environ.get("CPN_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
REDIS = os.environ.get("CPN_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
UP = re.compile(r"control plane up: REST \S+:(\d+), gRPC \S+:(\d+)")
TERMINAL = ("succeeded", "failed", "cancelled")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------ the deployment


class Database:
    """A fresh PostgreSQL database (migrated) and its Redis prefix, removed at the end."""

    def __init__(self) -> None:
        self.admin = create_engine(normalize_url(POSTGRES), isolation_level="AUTOCOMMIT")
        self.name = f"cpn_bench_{secrets.token_hex(5)}"
        with self.admin.connect() as c:
            c.execute(text(f'CREATE DATABASE "{self.name}"'))
        self.url = (
            make_url(normalize_url(POSTGRES)).set(database=self.name).render_as_string(hide_password=False)
        )
        upgrade(self.url)
        self.engine = make_engine(self.url)
        self.sessions = make_session_factory(self.engine)

    def drop(self) -> None:
        self.engine.dispose()
        bus = RedisBus(REDIS, prefix=default_prefix(Settings(database_url=self.url)))
        bus.delete_prefixed()
        bus.close()
        with self.admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)'))
        self.admin.dispose()


@dataclass
class Replica:
    """One `cpn server` process on fixed ports, restartable."""

    name: str
    env: dict[str, str]
    log_dir: Path
    http_port: int = 0
    grpc_port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    args: list[str] = field(default_factory=list)  # more `cpn server` options (e.g. --workers)

    def __post_init__(self) -> None:
        self.http_port, self.grpc_port = free_port(), free_port()

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def start(self, timeout_s: float | None = None) -> float:
        timeout_s = timeout_s if timeout_s is not None else patience(120.0)
        self.starts += 1
        log = self.log_dir / f"{self.name}-{self.starts}.log"
        began = time.monotonic()
        with open(log, "wb") as out:  # tied: a benchmark killed outright takes its replicas along
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "cpn", "server", "--port", str(self.http_port),
                 "--grpc-port", str(self.grpc_port), "--log-level", "WARNING", *self.args],
                env=tied_env({**self.env, "CPN_REPLICA_ID": self.name}), stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        # --log-level WARNING hides the "up" line: poll the health endpoint instead
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"replica {self.name} exited:\n{log.read_text(errors='replace')[-3000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.http_port}/healthz", timeout=2).status_code == 200:
                    return time.monotonic() - began
            except httpx.HTTPError:
                pass
            if time.monotonic() - began > timeout_s:
                raise RuntimeError(f"replica {self.name} not up in {timeout_s:.0f}s")
            time.sleep(0.1)

    def kill(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()

    def cpu_s(self) -> float:
        """CPU seconds the server's processes have used (user + system): the process and, with
        --workers, its workers (its session's processes)."""
        assert self.proc is not None
        ticks = 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:  # a process that just exited
                continue
            if int(fields[3]) == self.proc.pid:  # its session (start_new_session: the pid)
                ticks += int(fields[11]) + int(fields[12])
        return ticks / os.sysconf("SC_CLK_TCK")

    def heartbeats(self) -> float:
        body = httpx.get(f"http://127.0.0.1:{self.http_port}/metrics", timeout=10).text
        m = re.search(r"^cpn_heartbeats_total ([0-9.e+]+)$", body, re.M)
        return float(m.group(1)) if m else 0.0


def server_env(db: Database, workdir: Path, admin_key: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CPN_")}
    env.update(
        CPN_ENVIRONMENT="development", CPN_DATABASE_URL=db.url, CPN_REDIS_URL=REDIS,
        CPN_DATA_DIR=str(workdir), CPN_ADMIN_API_KEY=admin_key, PYTHONUNBUFFERED="1", **extra,
    )  # fmt: skip
    return env


def admin_client(replica: Replica, admin_key: str) -> httpx.Client:
    return httpx.Client(
        base_url=f"http://127.0.0.1:{replica.http_port}",
        headers={"Authorization": f"Bearer {admin_key}"},
        timeout=60,
    )


# ------------------------------------------------------------------ 1. heartbeats


def _register_request(token: str, i: int) -> agent_pb2.RegisterRequest:
    return agent_pb2.RegisterRequest(
        enrollment_token=token, region="sim", cluster=f"sim-{i // 50}", provider="sim", hostname=f"sim-{i}",
        devices=[agent_pb2.Device(index=0, model="cpu", memory_gb=1, measured_tflops=0.1, kind="cpu")],
        price_per_device_hour=1.0, agent_version="bench", advertise_host="127.0.0.1",
        sync_port_min=40000, sync_port_max=40009,
    )  # fmt: skip


async def _simulate(
    target: str, token: str, indices: list[int], seconds: float, ready: Any, go: Any, acked_count: Any
) -> None:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = agent_pb2_grpc.AgentServiceStub(channel)
        end = asyncio.Event()
        registering = asyncio.Semaphore(8)

        async def node(i: int) -> None:
            # as a real agent does: register, then hold the stream at once (a registered node
            # that stays silent is reaped as lost, which is not what this measures)
            async with registering:
                r = await stub.Register(_register_request(token, i), timeout=120)
            node_id, node_token = r.node_id, r.node_token
            acked = asyncio.Event()

            async def messages() -> Any:
                yield agent_pb2.AgentMessage(hello=agent_pb2.Hello(node_id=node_id, node_token=node_token))
                await acked.wait()
                seq = 0
                while not end.is_set():
                    seq += 1
                    yield agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(seq=seq, sent_at=time.time()))
                    if seq % 16 == 0:
                        await asyncio.sleep(0)  # let the other streams of this process take turns

            for attempt in range(5):  # as a real agent does: a stream refused as UNAVAILABLE is retried
                call = stub.Connect(messages())
                try:
                    async for msg in call:
                        if msg.WhichOneof("kind") == "ack":
                            acked.set()
                            with acked_count.get_lock():
                                acked_count.value += 1
                        if end.is_set():
                            break
                except grpc.aio.AioRpcError as exc:
                    if acked.is_set() or exc.code() != grpc.StatusCode.UNAVAILABLE or attempt == 4:
                        raise
                    await asyncio.sleep(0.5 * (attempt + 1))
                    continue
                finally:
                    call.cancel()
                return

        async def node_said(i: int) -> None:
            try:
                await node(i)
            except Exception as exc:  # a stream not accepted says why, not only that it was not
                print(f"simulated node {i}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)

        ready.release()
        await asyncio.to_thread(go.wait)
        streams = [asyncio.create_task(node_said(i)) for i in indices]
        await asyncio.sleep(seconds)
        end.set()
        await asyncio.wait(streams, timeout=10)
        for s in streams:
            s.cancel()


def _simulator(
    target: str, token: str, indices: list[int], seconds: float, ready: Any, go: Any, acked: Any
) -> None:
    die_with_parent(mp.parent_process().pid)  # type: ignore[union-attr]  # a spawned child has one
    asyncio.run(_simulate(target, token, indices, seconds, ready, go, acked))


def bench_heartbeats(
    replica: Replica, admin: httpx.Client, nodes: int, procs: int, seconds: float
) -> tuple[float, float]:
    """Heartbeats ingested per second of wall time, and per CPU second of the server process."""
    token = admin.post("/v1/tokens", json={"provider": "sim", "note": "bench", "max_uses": nodes}).json()[
        "token"
    ]

    ctx = mp.get_context("spawn")
    ready, go, acked = ctx.Semaphore(0), ctx.Event(), ctx.Value("i", 0)
    window = seconds + patience(120.0) + 5  # nodes register and connect first (slow on a loaded machine)
    indices = list(range(nodes))
    workers = [
        ctx.Process(
            target=_simulator, args=(replica.grpc_target, token, indices[i::procs], window, ready, go, acked)
        )
        for i in range(procs)
    ]
    for w in workers:
        w.start()
    for _ in workers:
        ready.acquire()
    go.set()
    ceiling = patience(120.0)
    deadline = time.monotonic() + ceiling
    while acked.value < nodes:  # every node registered and its stream accepted: not what is measured
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {acked.value} of {nodes} streams were accepted in {ceiling:.0f} s")
        time.sleep(0.1)
    time.sleep(1)  # and streaming
    before, t0, cpu0 = replica.heartbeats(), time.monotonic(), replica.cpu_s()
    time.sleep(seconds)
    after, t1, cpu1 = replica.heartbeats(), time.monotonic(), replica.cpu_s()
    for w in workers:
        w.terminate()  # the window is over: stop streaming now, not when the long window ends
        w.join(60)
    return (after - before) / (t1 - t0), (after - before) / max(1e-9, cpu1 - cpu0)


# ------------------------------------------------------------------ 2. submissions


def bench_job(steps: int, dp: int, regions: list[str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "bench",
        "model": {"family": "gpt", "n_layers": 1, "d_model": 32, "n_heads": 2, "vocab": 32, "seq_len": 32},
        "data": {"kind": "synthetic-markov", "seed": 1},
        "training": {"steps": steps, "global_batch_tokens": dp * 4 * 32, "lr": 3e-3},
        "parallelism": {"dp": dp, "tp": 1, "pp": 1, "zero": 0},
        "sync": {"mode": "local_sgd", "every": 5},
        "qos": {"max_hours": 1, "objective": "cost"},
    }
    if regions:
        spec["qos"]["regions"] = regions
    return spec


@dataclass
class Submissions:
    per_s: float
    p99_ms: float
    per_server_cpu_s: float
    server_cores: float  # CPU the replicas' processes used, per second of the window
    client_cores: float  # CPU the load generator used, per second of the window
    stored: int  # jobs the database holds from the window: one per 201 answer


def bench_submissions(
    db: Database, replicas: list[Replica], admin_key: str, seconds: float, concurrency: int, client_procs: int
) -> Submissions:
    """Concurrent ``POST /v1/jobs`` over keep-alive connections spread across ``replicas`` (each a
    full replica: REST on one PostgreSQL + Redis; the leader among them also runs the placer)."""
    targets = [("127.0.0.1", r.http_port) for r in replicas]
    body = json.dumps({"spec": bench_job(10, 1, regions=["nowhere"]), "choice": "cheapest"}).encode()
    run_clients(targets, admin_key, body, concurrency, 2.0, client_procs)  # warm-up: connections, caches
    with db.sessions() as s:
        before = s.scalar(select(func.count()).select_from(Job))
    cpu0 = sum(r.cpu_s() for r in replicas)
    out, elapsed = run_clients(targets, admin_key, body, concurrency, seconds, client_procs)
    cpu = sum(r.cpu_s() for r in replicas) - cpu0
    with db.sessions() as s:
        stored = s.scalar(select(func.count()).select_from(Job)) - before
    if out.first_error or out.job_ids != len(out.latencies_s):
        raise RuntimeError(f"submissions answered {out.statuses}; first error {out.first_error}")
    if stored != out.job_ids:
        raise RuntimeError(f"{out.job_ids} submissions answered 201 but {stored} jobs were stored")
    lat = sorted(out.latencies_s)
    return Submissions(
        per_s=len(lat) / elapsed,
        p99_ms=lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1000,
        per_server_cpu_s=len(lat) / max(1e-9, cpu),
        server_cores=cpu / elapsed,
        client_cores=out.cpu_s / elapsed,
        stored=stored,
    )


# ------------------------------------------------------------------ 3. chaos


@dataclass
class Outcome:
    lost: int = 0
    duplicated: int = 0
    stuck: int = 0


def judge(
    db: Database, client: httpx.Client, job_ids: list[str], expected_tasks: int, timeout_s: float
) -> Outcome:
    out = Outcome()
    deadline = time.monotonic() + timeout_s
    for job_id in job_ids:
        while True:
            job = client.get(f"/v1/jobs/{job_id}").raise_for_status().json()
            if job["status"] in TERMINAL or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        if job["status"] not in TERMINAL:
            out.stuck += 1
        elif (
            job["status"] != "succeeded"
            or job["attempt"] != 1
            or any(t["status"] != "succeeded" for t in job["tasks"])
        ):
            out.lost += 1
            print(f"  lost: job {job_id} {job['status']} attempt {job['attempt']}: {job['reason']}")
        with db.sessions() as s:
            tasks = len(s.scalars(select(Task.id).where(Task.job_id == job_id)).all())
            steps = Counter(
                s.execute(
                    select(TaskMetric.task_id, TaskMetric.step).join(Task).where(Task.job_id == job_id)
                ).all()
            )
        if tasks > expected_tasks or (steps and max(steps.values()) > 1):
            out.duplicated += 1
    return out


def wait_training(client: httpx.Client, job_ids: list[str], timeout_s: float | None = None) -> None:
    """Until every job runs and each of its stages reported step 2 (ceiling: ``patience(300)``)."""
    timeout_s = timeout_s if timeout_s is not None else patience(300.0)
    deadline = time.monotonic() + timeout_s
    for job_id in job_ids:
        while True:
            job = client.get(f"/v1/jobs/{job_id}").raise_for_status().json()
            series = client.get(f"/v1/jobs/{job_id}/metrics").raise_for_status().json()["series"]
            if (
                job["status"] == "running"
                and series
                and all(p and p[-1]["step"] >= 2 for p in series.values())
            ):
                break
            if job["status"] in TERMINAL or time.monotonic() > deadline:
                raise RuntimeError(
                    f"job {job_id} is {job['status']} before the chaos (waited {timeout_s:.0f} s for it"
                    f" to train to step 2): {job.get('reason') or job.get('deferred')}"
                )
            time.sleep(0.3)


def leader_of(db: Database) -> str:
    with db.sessions() as s:
        lease = s.get(LeaderLease, SINGLETONS)
        return lease.holder if lease else ""


def all_back_since(db: Database, since: Any) -> bool:
    with db.sessions() as s:
        rows = s.scalars(
            select(Node.last_heartbeat_at)
        ).all()  # the chaos database holds the real agents only
    return bool(rows) and all(r is not None and as_utc(r) >= since for r in rows)


def chaos(workdir: Path, jobs: int, steps: int) -> dict[str, Any]:
    db = Database()
    admin_key = "cpn_admin_" + secrets.token_urlsafe(16)
    env = server_env(db, workdir, admin_key, CPN_HEARTBEAT_INTERVAL_S="1", CPN_HEARTBEAT_MISSES="3")
    (workdir / "logs").mkdir(exist_ok=True)
    r1, r2 = Replica("r1", env, workdir / "logs"), Replica("r2", env, workdir / "logs")
    agents: list[subprocess.Popen[bytes]] = []
    result: dict[str, Any] = {}
    try:
        r1.start()
        client = admin_client(r1, admin_key)
        specs = [
            LocalAgent("eu-west", "paris-1", "lumen", 1.0, "EU", devices=f"cpu:{jobs}"),
            LocalAgent("us-east", "virginia-1", "atlas", 2.0, "US", devices=f"cpu:{jobs}"),
        ]
        tokens = enroll(client, specs, note="chaos")
        # Every agent knows both replicas from the start; r2 joins for the failover phase.
        agents = start_agents(specs, f"{r1.grpc_target},{r2.grpc_target}", tokens, workdir, first_port=32500)
        wait_for_clusters(client, len(specs), timeout_s=patience(300.0))
        link = {"src": "eu-west", "dst": "us-east", "bandwidth_gbps": 1.0, "latency_ms": 40.0,
                "egress_price_per_gb": 0.02}  # fmt: skip
        client.put("/v1/links", json=link).raise_for_status()

        def submit(c: httpx.Client) -> list[str]:
            body = {"spec": bench_job(steps, 2), "choice": "cheapest"}
            return [c.post("/v1/jobs", json=body).raise_for_status().json()["id"] for _ in range(jobs)]

        # restart: the only replica, killed mid-job, back on the same database
        ids = submit(client)
        wait_training(client, ids)
        r1.kill()
        time.sleep(3 + 1)  # away longer than the loss threshold: every liveness key expires
        restart_s = r1.start()
        restarted = judge(db, client, ids, expected_tasks=2, timeout_s=patience(600.0))
        result.update(restart_s=restart_s, restart=restarted.__dict__)
        print(f"restart: replica back in {restart_s:.1f}s; {restarted}")

        # failover: two replicas, the leader killed mid-job
        r2.start()
        leader = r1 if leader_of(db) == "r1" else r2
        survivor = r2 if leader is r1 else r1
        ids = submit(client)
        wait_training(client, ids)
        killed_wall, killed = utcnow(), time.monotonic()
        leader.kill()
        led_s = back_s = None
        while led_s is None or back_s is None:
            now = time.monotonic() - killed
            if led_s is None and leader_of(db) == survivor.name:
                led_s = now
            if back_s is None and all_back_since(db, killed_wall):
                back_s = now
            if now > 120:
                break
            time.sleep(0.05)
        client.close()
        client = admin_client(survivor, admin_key)
        failed_over = judge(db, client, ids, expected_tasks=2, timeout_s=patience(600.0))
        failover_s = max(led_s or float("inf"), back_s or float("inf"))
        result.update(
            failover_s=failover_s, leader_s=led_s, agents_back_s=back_s, failover=failed_over.__dict__
        )
        print(f"failover: survivor led after {led_s}s, agents back after {back_s}s; {failed_over}")
        client.close()
    finally:
        stop_agents(agents)
        for r in (r1, r2):
            r.stop()
        db.drop()
    return result


# ------------------------------------------------------------------ 4. stranded processes

RUN_MARK = "CPN_BENCH_RUN"


def run_processes(mark: str) -> dict[int, str]:
    """Live processes whose environment carries ``mark`` (``RUN_MARK``), with their command lines.
    ``/proc/<pid>/environ`` is the environment a process started with: every process a run
    started inherits it, whatever session it runs in and whoever its parent is now."""
    needle = f"{RUN_MARK}={mark}".encode()
    found = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if needle not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue  # ended; only its exit status waits to be collected
            found[int(proc.name)] = (
                (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            )
        except (OSError, IndexError):
            continue
    return found


def wait_processes(mark: str, needle: str, count: int, timeout_s: float | None = None) -> None:
    timeout_s = timeout_s if timeout_s is not None else patience(300.0)
    deadline = time.monotonic() + timeout_s
    while sum(needle in cmd for cmd in run_processes(mark).values()) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"not {count} processes running {needle!r} after {timeout_s:.0f}s")
        time.sleep(0.2)


def survivors(
    mark: str, parents: list[subprocess.Popen[bytes]], ceiling_s: float = 30.0
) -> tuple[int, float]:
    """SIGKILL ``parents``; the run's processes still alive once none is left or after the
    ceiling (the kernel and the keepers act within a second), and when the last went."""
    killed = time.monotonic()
    for p in parents:
        os.kill(p.pid, signal.SIGKILL)
    for p in parents:
        p.wait(30)
    while (left := run_processes(mark)) and time.monotonic() - killed < ceiling_s:
        time.sleep(0.05)
    for pid, cmd in left.items():
        print(f"  stranded: {pid} {cmd[:200]}")
    return len(left), time.monotonic() - killed


def stranded(workdir: Path, steps: int) -> dict[str, Any]:
    """Phase 4: the processes of killed runs left alive (see the module's docstring)."""
    db = Database()
    admin_key = "cpn_admin_" + secrets.token_urlsafe(16)
    mark = secrets.token_hex(8)
    env = server_env(db, workdir, admin_key, CPN_HEARTBEAT_INTERVAL_S="1", CPN_HEARTBEAT_MISSES="3")
    env[RUN_MARK] = mark
    (workdir / "logs").mkdir(exist_ok=True)
    server = Replica("stranded", env, workdir / "logs", args=["--workers", "2"])
    agents: list[subprocess.Popen[bytes]] = []
    demo: subprocess.Popen[bytes] | None = None
    result: dict[str, Any] = {}
    try:
        server.start()
        client = admin_client(server, admin_key)
        specs = [
            LocalAgent("eu-west", "paris-1", "lumen", 1.0, "EU", measure_profile=False),
            LocalAgent("us-east", "virginia-1", "atlas", 2.0, "US", measure_profile=False),
        ]
        tokens = enroll(client, specs, note="stranded")
        agent_env = {**os.environ, RUN_MARK: mark, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        agents = start_agents(specs, server.grpc_target, tokens, workdir / "stranded", 34500, agent_env)
        wait_for_clusters(client, len(specs), timeout_s=patience(300.0))
        link = {"src": "eu-west", "dst": "us-east", "bandwidth_gbps": 1.0, "latency_ms": 40.0,
                "egress_price_per_gb": 0.02}  # fmt: skip
        client.put("/v1/links", json=link).raise_for_status()
        job = client.post("/v1/jobs", json={"spec": bench_job(steps, 4), "choice": "cheapest"})
        job_id = job.raise_for_status().json()["id"]
        wait_training(client, [job_id])
        client.close()
        wait_processes(mark, "-u -m training.worker", 4)  # torchrun starts its ranks as `python -u`
        running = len(run_processes(mark))
        left, gone_s = survivors(mark, [server.proc, *agents])  # type: ignore[list-item]
        result.update(fleet=left, fleet_processes=running, fleet_gone_s=gone_s)
        print(
            f"stranded: {left} of {running} processes of a --workers server and two training agents"
            f" (the last went {gone_s:.2f}s after the kill)"
        )

        demo_dir, demo_mark = workdir / "demo", secrets.token_hex(8)
        demo_dir.mkdir()
        # TMPDIR: the demo's directory and its agents' reference step lock are this run's.
        demo_env = {**agent_env, RUN_MARK: demo_mark, "TMPDIR": str(demo_dir)}
        with open(workdir / "logs" / "demo.log", "wb") as out:
            demo = subprocess.Popen(
                [sys.executable, "-m", "cpn", "demo"], env=demo_env, stdout=out, stderr=subprocess.STDOUT
            )
        wait_processes(demo_mark, "-m agent --server", 3)
        wait_processes(demo_mark, "-u -m training.reference_step", 1)
        running = len(run_processes(demo_mark))
        left, gone_s = survivors(demo_mark, [demo])
        result.update(demo=left, demo_processes=running, demo_gone_s=gone_s)
        print(
            f"stranded: {left} of {running} processes of a demo whose agents were measuring"
            f" (the last went {gone_s:.2f}s after the kill)"
        )
    finally:
        for p in [*agents, *([demo] if demo is not None else [])]:
            if p.poll() is None:
                p.kill()
        server.stop()
        db.drop()
    result["stranded_processes"] = result.get("fleet", 0) + result.get("demo", 0)
    return result


# ------------------------------------------------------------------ main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--nodes", type=int, default=200, help="simulated agents (streams)")
    ap.add_argument("--client-procs", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=16, help="concurrent submitting connections")
    ap.add_argument("--replicas", type=int, default=2, help="replicas the submissions are spread over")
    ap.add_argument("--submit-procs", type=int, default=1, help="load generator processes")
    ap.add_argument("--no-chaos", action="store_true")
    ap.add_argument("--no-stranded", action="store_true")
    ap.add_argument("--only-stranded", action="store_true", help="phase 4 alone")
    ap.add_argument(
        "--busy", type=int, default=0, help="CPU-bound loops beside the benchmark for its whole run"
    )
    args = ap.parse_args()
    if not 0 <= args.busy <= 64:
        ap.error("--busy: 0 to 64 loops")
    busy = start_busy_loops(args.busy)
    try:
        run(args)
    finally:
        for loop in busy:
            loop.kill()
            loop.wait()


def start_busy_loops(n: int) -> list[subprocess.Popen[bytes]]:
    """Other tenants' work: ``n`` CPU-bound loops, each ending with this process however it ends."""
    code = "from contracts.lifetime import die_with_parent; die_with_parent()\nwhile True: pass"
    return [subprocess.Popen([sys.executable, "-c", code], env=tied_env()) for _ in range(n)]


def run(args: argparse.Namespace) -> None:
    seconds = 5.0 if args.quick else 15.0
    rows: list[tuple[str, str, str]] = []
    final: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="cpn-bench-cp-") as tmp:
        workdir = Path(tmp)
        if not args.only_stranded:
            load_rows, load_final = load_and_chaos(args, workdir, seconds)
            rows += load_rows
            final.update(load_final)
        if not args.no_stranded:
            st = stranded(workdir, steps=100_000)
            rows.append(("stranded processes", str(st["stranded_processes"]), "0"))
            final["stranded_processes"] = st["stranded_processes"]
    rows.append(("load average (1 min)", f"{os.getloadavg()[0]:.1f}", f"{os.cpu_count()} cores"))
    rows.append(("busy loops beside it", str(args.busy), "--busy"))
    final["busy_loops"] = args.busy
    print(f"\n{'figure':<26}{'measured':>12}{'target':>14}")
    for name, value, target in rows:
        print(f"{name:<26}{value:>12}{target:>14}")
    print(json.dumps(final))


def load_and_chaos(
    args: argparse.Namespace, workdir: Path, seconds: float
) -> tuple[list[tuple[str, str, str]], dict[str, Any]]:
    """Phases 1 to 3: their table rows and their figures."""
    db = Database()
    admin_key = "cpn_admin_" + secrets.token_urlsafe(16)
    env = server_env(db, workdir, admin_key)
    replicas = [Replica(f"load-{i + 1}", env, workdir) for i in range(max(1, args.replicas))]
    try:
        replicas[0].start()
        with admin_client(replicas[0], admin_key) as admin:
            hb, hb_cpu = bench_heartbeats(replicas[0], admin, args.nodes, args.client_procs, seconds)
        print(f"heartbeats: {hb:,.0f}/s from {args.nodes} streams ({hb_cpu:,.0f} per server CPU-s)")
        for replica in replicas[1:]:
            replica.start()
        load_at_start = os.getloadavg()[0]
        sub = bench_submissions(db, replicas, admin_key, seconds, args.concurrency, args.submit_procs)
        load_at_end = os.getloadavg()[0]
        print(
            f"submissions: {sub.per_s:,.0f}/s, p99 {sub.p99_ms:.1f} ms ({args.concurrency} connections "
            f"over {len(replicas)} replicas; {sub.per_server_cpu_s:,.0f} per server CPU-s; server "
            f"{sub.server_cores:.2f} cores, client {sub.client_cores:.2f} cores; {sub.stored} jobs "
            f"stored; load {load_at_start:.1f} -> {load_at_end:.1f})"
        )
    finally:
        for replica in replicas:
            replica.stop()
        db.drop()
    ch = {} if args.no_chaos else chaos(workdir, jobs=1 if args.quick else 2, steps=300)
    rows = [
        ("heartbeats/s", f"{hb:,.0f}", ">= 5,000"),
        ("submissions/s", f"{sub.per_s:,.0f}", ">= 200"),
        ("submit p99 ms", f"{sub.p99_ms:.1f}", "<= 100"),
        ("heartbeats/server CPU-s", f"{hb_cpu:,.0f}", ""),
        ("submissions/server CPU-s", f"{sub.per_server_cpu_s:,.0f}", ""),
        ("server cores (submitting)", f"{sub.server_cores:.2f}", f"{len(replicas)} replicas"),
        ("client cores (submitting)", f"{sub.client_cores:.2f}", ""),
    ]
    if ch:
        rows += [
            ("failover s", f"{ch['failover_s']:.2f}", "<= 10"),
            ("jobs lost on restart", str(ch["restart"]["lost"] + ch["restart"]["stuck"]), "0"),
            ("jobs lost on failover", str(ch["failover"]["lost"] + ch["failover"]["stuck"]), "0"),
            ("jobs duplicated", str(ch["restart"]["duplicated"] + ch["failover"]["duplicated"]), "0"),
        ]
    final = {
        "heartbeats_per_s": round(hb, 1),
        "submissions_per_s": round(sub.per_s, 1),
        "submit_p99_ms": round(sub.p99_ms, 2),
        "heartbeats_per_server_cpu_s": round(hb_cpu, 1),
        "submissions_per_server_cpu_s": round(sub.per_server_cpu_s, 1),
        "submit_server_cores": round(sub.server_cores, 2),
        "submit_client_cores": round(sub.client_cores, 2),
        "submit_replicas": len(replicas),
        "failover_s": round(ch["failover_s"], 2) if ch else None,
        "jobs_lost_on_restart": ch["restart"]["lost"] + ch["restart"]["stuck"] if ch else None,
        "jobs_lost_on_failover": ch["failover"]["lost"] + ch["failover"]["stuck"] if ch else None,
        "jobs_duplicated": ch["restart"]["duplicated"] + ch["failover"]["duplicated"] if ch else None,
    }
    return rows, final


if __name__ == "__main__":
    main()
