"""``cpn agent``: the node daemon's command line.

``agent_command`` is a typer command function; the ``cpn`` app mounts it with
``app.command("agent")(agent_command)``. ``run_agent`` is the same without typer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import typer
from pydantic import ValidationError

from agent.daemon import Agent
from agent.settings import AgentSettings
from contracts.lifetime import die_with_parent

SLURM_KEYS = ("partition", "account", "poll_s", "gpu_memory_gb", "gpu_tflops", "srun")  # --slurm KEY=VALUE
NCCL_KEYS = ("socket_ifname", "ib_hca", "timeout_s", "debug")  # --nccl KEY=VALUE
SLURM_HELP = (
    "With --backend slurm: KEY=VALUE, repeatable; keys partition, account, poll_s (how often a job's"
    " state is read), gpu_memory_gb and gpu_tflops (the cluster's GPUs, declared), srun (1: every"
    " task as an srun step, one node too)"
)


def run_agent(settings: AgentSettings) -> int:
    """Run the agent until SIGTERM/SIGINT; returns the process exit code (0 clean, 2 fatal)."""
    return asyncio.run(Agent(settings).run())


def settings_from_options(options: Mapping[str, Any]) -> AgentSettings:
    """The agent's settings from ``agent_command``'s options by name (AgentSettings refuses a name
    it does not know); the few whose unit or name differ are converted. Reports what is invalid
    and exits 2."""
    values = {k: v for k, v in options.items() if k != "log_level"}
    values["spot_price_per_device_hour"] = values.pop("spot_price")
    values["reconnect_min_s"] = min(0.5, values["reconnect_max_s"])
    values["cache_max_bytes"] = int(values.pop("cache_max_gb") * 1e9)
    values["pip_args"] = tuple(values.pop("pip_arg"))
    for flag, keys in (("slurm", SLURM_KEYS), ("nccl", NCCL_KEYS)):
        for item in values.pop(flag, []):
            key, sep, value = item.partition("=")
            if not sep or key not in keys:
                typer.echo(
                    f"cpn agent: --{flag}: expected KEY=VALUE, KEY one of {', '.join(keys)}; got {item!r}",
                    err=True,
                )
                raise typer.Exit(2)
            values[f"{flag}_{key}"] = value
    try:
        return AgentSettings(**values)
    except ValidationError as exc:
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "settings"
            typer.echo(f"cpn agent: {where}: {err['msg']}", err=True)
        raise typer.Exit(2) from None


def agent_command(
    server: str = typer.Option(
        ...,
        "--server",
        help="Control plane gRPC HOST:PORT; replicas as HOST:PORT,HOST:PORT (failover)",
    ),
    tls_ca_file: Path | None = typer.Option(
        None, "--tls-ca-file", help="CA of the control plane's certificate (TLS; unset: plaintext)"
    ),
    tls_server_name: str | None = typer.Option(
        None, "--tls-server-name", help="Name to verify in the server certificate (default: the host)"
    ),
    enroll_server: str | None = typer.Option(
        None,
        "--enroll-server",
        help="mTLS: enrollment HOST:PORT[,...], where the node gets its certificate",
    ),
    token: str = typer.Option(
        "", "--token", envvar="CPN_AGENT_TOKEN", help="Enrollment token (not needed once registered)"
    ),
    region: str = typer.Option(..., "--region", help="Region name, e.g. eu-west"),
    cluster: str = typer.Option(..., "--cluster", help="Cluster name within the region"),
    devices: str = typer.Option("auto", "--devices", help="'auto' (CUDA devices) or 'cpu:N' (N CPU slots)"),
    price_per_device_hour: float = typer.Option(..., "--price-per-device-hour", min=0),
    spot_price: float = typer.Option(0.0, "--spot-price", min=0, help="Spot price per device-hour (0: none)"),
    provider: str = typer.Option("", "--provider", help="Provider name (default: 'independent')"),
    jurisdiction: str = typer.Option("", "--jurisdiction", help="Legal jurisdiction of the region, e.g. EU"),
    advertise_host: str = typer.Option("127.0.0.1", "--advertise-host", help="Where peers reach this node"),
    sync_ports: str = typer.Option("29600-29699", "--sync-ports", help="Ports for cross-region sync servers"),
    intra_bandwidth_gbps: float = typer.Option(0.0, "--intra-bandwidth-gbps", min=0, help="0: not declared"),
    node_fabric_gbps: float = typer.Option(
        0.0, "--node-fabric-gbps", min=0, help="Node port into the fabric, Gb/s (0: none)"
    ),
    node_fabric_latency_ms: float = typer.Option(
        0.0, "--node-fabric-latency-ms", min=0, help="Node one-way fabric latency (0: none)"
    ),
    cross_cluster_host: str = typer.Option(
        "",
        "--cross-cluster-host",
        help="Where other clusters, of this region and of others, reach this node's torchrun endpoint"
        " (its sync ports and workers); set, the node may share a pipeline with them (default: none)",
    ),
    probe_port: int = typer.Option(
        0, "--probe-port", help="Port peers probe this node's links on (0: any free one, -1: none)"
    ),
    probe_bind: str = typer.Option(
        "0.0.0.0", "--probe-bind", help="Address the probe and checkpoint servers bind"
    ),
    checkpoint_port: int = typer.Option(
        0,
        "--checkpoint-port",
        help="Port the region's nodes fetch checkpoint copies from, over mutual TLS with each job's"
        " credentials (0: any free one, -1: none)",
    ),
    work_dir: Path = typer.Option(Path("./cpn-agent"), "--work-dir", help="Assignment configs and logs"),
    state_file: Path | None = typer.Option(None, "--state-file", help="Default: <work-dir>/agent-state.json"),
    reconnect_max_s: float = typer.Option(
        2.0, "--reconnect-max-s", help="Longest wait between reconnects (at most the heartbeat interval)"
    ),
    kill_grace_s: float = typer.Option(
        3.0, "--kill-grace-s", help="SIGTERM to SIGKILL when stopping workers"
    ),
    measure_profile: bool = typer.Option(
        True, "--measure-profile/--no-measure-profile", help="Run the reference worker step at start-up"
    ),
    profile_share_s: float = typer.Option(
        900.0,
        "--profile-share-s",
        min=0,
        max=86400,
        help="Take the reference figures an alike agent of this host measured this recently (0: measure)",
    ),
    probe_staging: bool = typer.Option(
        True,
        "--probe-staging/--no-probe-staging",
        help="Build a venv at start-up and fetch the store probe after registering: staging's cost here",
    ),
    cache_max_gb: float = typer.Option(
        100.0, "--cache-max-gb", min=0.001, help="Node cache of staged code and data, GB (LRU beyond it)"
    ),
    pip_arg: list[str] = typer.Option(
        [], "--pip-arg", help="Extra argument to pip install for users' requirements (repeatable)"
    ),
    pip_timeout_s: float = typer.Option(1800.0, "--pip-timeout-s", help="Longest a venv build may take"),
    checkpoint_retention_h: float = typer.Option(
        24.0,
        "--checkpoint-retention-h",
        min=0,
        help="Hours a job's checkpoints and run dirs are kept here after its last task on the node ended",
    ),
    allow_command_override: bool = typer.Option(False, "--allow-command-override", hidden=True),
    allow_unsandboxed: bool = typer.Option(
        False,
        "--allow-unsandboxed",
        help="Run users' code even where bubblewrap does not work on this node (the code then sees"
        " everything the agent's user can)",
    ),
    task_disk_gb: float = typer.Option(
        100.0, "--task-disk-gb", help="GiB a sandboxed task's directories may hold before it is stopped"
    ),
    task_tmp_gb: float = typer.Option(
        4.0, "--task-tmp-gb", help="GiB of a sandboxed task's private /tmp and of its /dev/shm (memory)"
    ),
    backend: str = typer.Option(
        "local", "--backend", help="Tasks run on: local (this node), slurm (its cluster)"
    ),
    slurm: list[str] = typer.Option([], "--slurm", help=SLURM_HELP),
    nccl: list[str] = typer.Option(
        [], "--nccl", help="KEY=VALUE, repeatable: socket_ifname, ib_hca, timeout_s, debug"
    ),
    log_level: str = typer.Option("INFO", "--log-level"),
) -> None:
    """Run the node agent: register this node's devices and run the work the control plane assigns."""
    _start(log_level)
    raise typer.Exit(run_agent(settings_from_options(locals())))  # every option above, by name


def _start(log_level: str) -> None:
    die_with_parent()  # started by `cpn demo` or a test fleet: not a moment longer than it
    _configure_logging(log_level)


def _configure_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # httpx logs each request's full URL at INFO: artifact URLs carry their tickets.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))
