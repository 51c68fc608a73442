"""Agents as local processes, for `cpn demo` and the end-to-end tests: the real `cpn agent`, on loopback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from contracts.lifetime import tied_env


@dataclass(frozen=True)
class LocalAgent:
    region: str
    cluster: str
    provider: str
    price: float
    jurisdiction: str = ""
    devices: str = "cpu:2"
    measure_profile: bool = True  # run the reference worker step before registering
    # Build a venv and fetch the store probe (what staging users' code costs there): off, as the
    # demo and most tests run the built-in model, which stages nothing.
    probe_staging: bool = False
    # Where other clusters reach its torchrun endpoint (``--cross-cluster-host``): it may then share
    # a group spanning nodes with other clusters' nodes, behind a link declared private.
    cross_cluster_host: str = ""
    extra_args: tuple[str, ...] = ()  # further `cpn agent` options (``--backend slurm``, say)


def start_agent(
    spec: LocalAgent,
    grpc_target: str,
    token: str,
    workdir: Path,
    sync_ports: tuple[int, int],
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start `cpn agent` in its own session (a terminal's Ctrl-C reaches the caller, which stops
    it), tied to this process: it dies with it, by any signal, and its workers with it. Call from
    the thread that stops it, which must live as long as it (``contracts.lifetime``). ``env``:
    its environment (default: this process's)."""
    agent_dir = workdir / f"agent-{spec.region}-{spec.cluster}"
    agent_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "agent",
        "--server", grpc_target, "--token", token,
        "--region", spec.region, "--cluster", spec.cluster, "--provider", spec.provider,
        "--devices", spec.devices, "--price-per-device-hour", str(spec.price),
        "--sync-ports", f"{sync_ports[0]}-{sync_ports[1]}",
        "--work-dir", str(agent_dir),
    ]  # fmt: skip
    if spec.jurisdiction:
        cmd += ["--jurisdiction", spec.jurisdiction]
    if not spec.measure_profile:
        cmd += ["--no-measure-profile"]
    if not spec.probe_staging:
        cmd += ["--no-probe-staging"]
    if spec.cross_cluster_host:
        cmd += ["--cross-cluster-host", spec.cross_cluster_host]
    cmd += list(spec.extra_args)
    log = open(agent_dir / "agent.log", "wb")  # noqa: SIM115 - the child owns it for its lifetime
    env = tied_env({**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"})
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def enroll(client: httpx.Client, specs: list[LocalAgent], note: str) -> dict[str, str]:
    """One enrollment token per provider (a token enrolls only its provider's nodes)."""
    uses = Counter(s.provider for s in specs)
    return {
        provider: client.post("/v1/tokens", json={"provider": provider, "note": note, "max_uses": n})
        .raise_for_status()
        .json()["token"]
        for provider, n in uses.items()
    }


def start_agents(
    specs: list[LocalAgent],
    grpc_target: str,
    tokens: dict[str, str],
    workdir: Path,
    first_port: int = 29600,
    env: Mapping[str, str] | None = None,
) -> list[subprocess.Popen[bytes]]:
    """One agent per spec, with its provider's token and its own block of 50 sync ports."""
    return [
        start_agent(
            s, grpc_target, tokens[s.provider], workdir, (first_port + 50 * i, first_port + 50 * i + 49), env
        )
        for i, s in enumerate(specs)
    ]


def kill_agent(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    """Signal the agent (its session holds only it): SIGKILL, and its workers die with it."""
    if proc.poll() is None:
        os.killpg(proc.pid, sig)


# An agent stops its workers within its kill grace (3 s): all are gone within 5 s of a stop.
STOP_GRACE_S = 4.0


def stop_agents(procs: list[subprocess.Popen[bytes]], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM (the agent stops its workers and exits), then SIGKILL what is left after the grace
    period (its workers end with it)."""
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
