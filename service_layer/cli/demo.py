"""`cpn demo`: the whole path of one job on the embedded default, in one command.

Starts the control plane (SQLite in a temp dir, in-process bus), three agents in three regions
with different prices, submits a small GPT job whose placement spans regions, shows progress,
then prints placement, loss against the entropy floor, and estimated vs. actual time and cost.
SIGINT or SIGTERM stops the agents and their workers within 5 s; any other end of the process,
SIGKILL included, takes them with it.
"""

from __future__ import annotations

import secrets
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from contracts.states import JOB_TERMINAL, JobState
from orchestration.settings import Settings
from service_layer.cli.local_fleet import LocalAgent, enroll, start_agents, stop_agents

# Three regions, two CPU slots each, priced differently; links as a provider would declare them.
DEMO_AGENTS: list[LocalAgent] = [
    LocalAgent(region="eu-west", cluster="paris-1", provider="lumen", price=1.20, jurisdiction="EU"),
    LocalAgent(region="eu-north", cluster="stockholm-1", provider="fjord", price=0.90, jurisdiction="EU"),
    LocalAgent(region="us-east", cluster="virginia-1", provider="atlas", price=2.10, jurisdiction="US"),
]
DEMO_LINKS: list[dict[str, Any]] = [
    {
        "src": "eu-west",
        "dst": "eu-north",
        "bandwidth_gbps": 1.0,
        "latency_ms": 25.0,
        "egress_price_per_gb": 0.02,
    },
    {
        "src": "eu-west",
        "dst": "us-east",
        "bandwidth_gbps": 0.5,
        "latency_ms": 80.0,
        "egress_price_per_gb": 0.05,
    },
    {
        "src": "eu-north",
        "dst": "us-east",
        "bandwidth_gbps": 0.3,
        "latency_ms": 95.0,
        "egress_price_per_gb": 0.05,
    },
]


def demo_job_spec(steps: int) -> dict[str, Any]:
    return {
        "name": "demo-gpt",
        "model": {"family": "gpt", "n_layers": 2, "d_model": 64, "n_heads": 4, "vocab": 64, "seq_len": 64},
        "data": {"kind": "synthetic-markov", "seed": 0},
        "training": {"steps": steps, "global_batch_tokens": 4 * 8 * 64, "lr": 3e-3, "seed": 0},
        "parallelism": {"dp": 4, "tp": 1, "pp": 1, "zero": 0},
        "sync": {"mode": "diloco", "every": 10, "compression": "int8"},
        "qos": {"max_hours": 1, "max_cost": 10, "objective": "cost"},
    }


# Agents register at once and are listed "measuring" until their profile (a real worker's reference
# step, ``agent/profile.py``) lands: tens of seconds on a small shared machine, minutes where several
# agents of a busy host take turns. This is a ceiling: the wait ends when the last one is ready.
REGISTRATION_TIMEOUT_S = 300.0


def wait_for_clusters(client: httpx.Client, n: int, timeout_s: float = REGISTRATION_TIMEOUT_S) -> None:
    """Until ``n`` clusters have a placeable node: registered, alive and its profile in ("alive";
    a node still measuring is listed "measuring")."""
    deadline = time.monotonic() + timeout_s
    while True:
        clusters = client.get("/v1/clusters").raise_for_status().json()
        nodes = [nd for c in clusters for nd in c.get("nodes", [])]
        ready = [c for c in clusters if any(nd.get("status") == "alive" for nd in c.get("nodes", []))]
        if len(ready) >= n:
            return
        if time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    measuring = sum(nd.get("status") == "measuring" for nd in nodes)
    raise RuntimeError(
        f"only {len(ready)} of {n} clusters had a placeable node within {timeout_s:.0f}s"
        f" ({len(nodes)} node(s) registered, {measuring} still measuring their profile); see agent logs"
    )


def watch_job(client: httpx.Client, job_id: str, console: Console, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[steps]}"),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        bar = progress.add_task(JobState.QUEUED, total=None, info="", steps="")
        while True:
            job = client.get(f"/v1/jobs/{job_id}").raise_for_status().json()
            m = job.get("progress") or {}
            info = ""
            if m.get("loss") is not None:
                info = f"loss {m['loss']:.3f}  {m.get('tokens_per_s', 0):,.0f} tok/s"
            total = m.get("total_steps") or None
            steps = f"{m.get('step', 0)}/{total} steps" if total else ""
            progress.update(
                bar,
                description=job["status"],
                completed=m.get("step", 0),
                total=total,
                info=info,
                steps=steps,
            )
            if job["status"] in JOB_TERMINAL:
                return job
            if time.monotonic() > deadline:
                raise RuntimeError(f"job {job_id} still {job['status']} after {timeout_s:.0f}s")
            time.sleep(0.5)


def _loss_summary(client: httpx.Client, job: dict[str, Any]) -> str | None:
    """Loss at the first and last reported step (mean over regions) beside the data's floor."""
    series = client.get(f"/v1/jobs/{job['id']}/metrics").raise_for_status().json()
    curves = [pts for pts in series["series"].values() if pts and pts[0]["loss"] is not None]
    if not curves:
        return None
    start = sum(c[0]["loss"] for c in curves) / len(curves)
    end = sum(c[-1]["loss"] for c in curves) / len(curves)
    floor, uniform = series.get("entropy_floor"), series.get("uniform_loss")
    text = f"loss {start:.3f} -> {end:.3f} nats/token"
    if floor is not None:
        text += f"   entropy floor {floor:.3f}"
        if uniform is not None and uniform > floor:
            text += (
                f"   (uniform {uniform:.3f}; {100 * (start - end) / (start - floor):.0f}% of the gap closed)"
            )
    return text


def _report(client: httpx.Client, job: dict[str, Any], console: Console) -> None:
    table = Table(title="placement")
    for col in ("region", "cluster", "node", "devices", "status"):
        table.add_column(col)
    for t in job.get("tasks", []):
        table.add_row(
            t["region"],
            t.get("cluster_name") or t["cluster_id"],
            t["node_id"][:8],
            ",".join(str(d) for d in t["device_indices"]),
            t["status"],
        )
    console.print(table)
    loss = _loss_summary(client, job)
    if loss:
        console.print(loss)
    est = job.get("estimates") or {}
    nan = float("nan")
    console.print(
        f"time  estimated {est.get('duration_s') or nan:.1f}s, "
        f"actual {job.get('actual_duration_s') or nan:.1f}s"
    )
    console.print(
        f"cost  estimated ${est.get('cost_total') or nan:.4f}, actual ${job.get('actual_cost') or nan:.4f}"
    )


def demo(
    keep: bool = typer.Option(False, "--keep", help="Keep the server and agents up for the dashboard"),
    steps: int = typer.Option(120, min=10, help="Training steps of the demo job"),
    timeout_s: float = typer.Option(170.0, help="Give up if the job has not finished by then"),
) -> None:
    """Run one GPT job across three regions on the embedded default (SQLite, in-process bus)."""
    from service_layer.server import start_server_in_thread

    # SIGTERM as Ctrl-C: the agents are stopped on the way out. They die with this process
    # anyway, by any signal (``local_fleet.start_agent``), but a stop lets them end cleanly.
    signal.signal(signal.SIGTERM, signal.default_int_handler)

    console = Console()
    workdir = Path(tempfile.mkdtemp(prefix="cpn-demo-"))
    admin_key = "cpn_admin_" + secrets.token_urlsafe(24)
    settings = Settings(
        data_dir=workdir,
        http_port=0,
        grpc_port=0,
        heartbeat_interval_s=1.0,
        # Six misses, not three: on a small shared machine the agents' own start-up (importing
        # torch, measuring devices) can hold a heartbeat back for seconds.
        heartbeat_misses=6,
        admin_api_key=admin_key,
    )
    console.print(f"[bold]cpn demo[/] — working directory {workdir}")
    handle = start_server_in_thread(settings)
    agents: list[subprocess.Popen[bytes]] = []
    ok = False
    try:
        client = httpx.Client(
            base_url=handle.http_url, headers={"Authorization": f"Bearer {admin_key}"}, timeout=30
        )
        console.print(f"control plane: REST {handle.http_url}  gRPC {handle.grpc_target}")
        tokens = enroll(client, DEMO_AGENTS, note="demo")
        agents = start_agents(DEMO_AGENTS, handle.grpc_target, tokens, workdir)
        console.print(
            "agents started; each registers at once and measures a reference step before it is placed ..."
        )
        wait_for_clusters(client, len(DEMO_AGENTS))
        for link in DEMO_LINKS:  # regions exist once their agents registered
            client.put("/v1/links", json=link).raise_for_status()
        console.print(f"{len(DEMO_AGENTS)} agents ready: " + ", ".join(a.region for a in DEMO_AGENTS))

        spec = demo_job_spec(steps)
        quote = client.post("/v1/quotes", json=spec).raise_for_status().json()
        for opt in quote["options"]:
            e = opt["estimates"]
            console.print(
                f"  option {opt['id']} [{opt.get('label') or '-'}]: regions {', '.join(opt['regions'])}, "
                f"~{e['duration_s']:.0f}s, ${e['cost']['total']:.4f}"
            )
        job = client.post("/v1/jobs", json={"quote_id": quote["id"], "option_id": quote["options"][0]["id"]})
        job_id = job.raise_for_status().json()["id"]
        console.print(f"submitted job {job_id}")
        final = watch_job(client, job_id, console, timeout_s)
        _report(client, final, console)
        console.print(f"dashboard: {handle.http_url}/dashboard (open from this machine)", soft_wrap=True)
        ok = final["status"] == JobState.SUCCEEDED
        if not ok:
            console.print(f"[red]job {final['status']}: {final.get('reason')}[/]")
        if keep:
            console.print("--keep: server and agents stay up; Ctrl-C to stop")
            try:
                while True:
                    time.sleep(1)
            except KeyboardInterrupt:
                pass
    finally:
        stop_agents(agents)
        handle.stop()
    raise typer.Exit(0 if ok else 1)
