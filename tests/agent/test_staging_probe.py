"""What staging costs on a node and what its cache holds: a real agent process against a real
control plane (REST and gRPC, the embedded artifact store) measures its link to the store through
the route tasks stage from, builds a venv, and reports both with its cache."""

from __future__ import annotations

import hashlib
import math
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from agent import code_env
from agent.fetch import blobs_dir
from agent.settings import AgentSettings
from agent.staging_probe import ProbeBlob, cache_listing, probe_store
from orchestration.db.models import Node, NodeCacheEntry
from orchestration.settings import Settings
from service_layer.server import ServerHandle, start_server_in_thread
from tests.resource_layer.harness import enrollment_token, wait_for

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PROBE_BYTES = 1 << 20


def _hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[ServerHandle]:
    settings = Settings(
        environment="development", data_dir=tmp_path / "cp", http_port=0, grpc_port=0,
        heartbeat_interval_s=0.5, heartbeat_misses=6, link_probe_bytes=PROBE_BYTES,
    )  # fmt: skip
    handle = start_server_in_thread(settings)
    yield handle
    handle.stop()


def test_an_agent_measures_staging_and_reports_what_its_cache_holds(
    plane: ServerHandle, tmp_path: Path
) -> None:
    work = tmp_path / "agent"
    # What an earlier life of the agent left in its cache: a blob and a complete venv.
    blob = b"a shard staged before"
    blobs_dir(work).mkdir(parents=True)
    (blobs_dir(work) / _hex(blob)).write_bytes(blob)
    (blobs_dir(work) / (_hex(b"half") + ".partial")).write_bytes(b"ha")  # not a blob (yet)
    venv = code_env.venvs_root(work) / _hex(b"numpy\n")
    venv.mkdir(parents=True)
    (venv / code_env.VENV_DONE).write_text("sha256:" + _hex(b"numpy\n"))
    cmd = [
        sys.executable, "-m", "agent", "--server", plane.grpc_target, "--token", enrollment_token(plane.ctx),
        "--region", "eu-west", "--cluster", "paris-1", "--provider", "lumen", "--devices", "cpu:1",
        "--price-per-device-hour", "1", "--work-dir", str(work), "--no-measure-profile",
        "--allow-unsandboxed",  # the venv is measured wherever users' code may run
    ]  # fmt: skip
    with open(tmp_path / "agent.log", "wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:

        def reported() -> tuple[dict, set[tuple[str, str]]] | None:
            with plane.ctx.session_factory() as s:
                probe = s.scalar(select(Node.staging_probe))
                cache = {(e.kind, e.digest) for e in s.scalars(select(NodeCacheEntry))}
            return (probe, cache) if probe and cache else None

        probe, cache = wait_for(reported, timeout=120, what="the staging probe and the cache report")
    finally:
        proc.terminate()
        proc.wait(20)
        sys.stderr.write((tmp_path / "agent.log").read_text(errors="replace")[-4000:])
    # Fetched through the store's ticketed route on loopback: fixed seconds and a rate, both real.
    assert probe["error"] == "" and probe["probe_bytes"] == PROBE_BYTES
    assert math.isfinite(probe["bytes_per_s"]) and probe["bytes_per_s"] > 0
    assert math.isfinite(probe["fetch_fixed_s"]) and probe["fetch_fixed_s"] > 0
    assert probe["venv_s"] > 0.05  # python -m venv and pip's start-up, CPU seconds
    assert cache == {("blob", "sha256:" + _hex(blob)), ("venv", "sha256:" + _hex(b"numpy\n"))}
    assert not (work / "cache" / "probe").exists()  # the probe's own cache went with it
    assert sorted(p.name for p in code_env.venvs_root(work).iterdir()) == [venv.name]


def test_a_store_that_does_not_answer_is_reported_unmeasured_at_once(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1/artifacts/content/sha256:{'a' * 64}?ticket=t"
    settings = AgentSettings(
        server=f"127.0.0.1:{port}",
        region="eu-west",
        cluster="c0",
        price_per_device_hour=1.0,
        work_dir=tmp_path,
    )
    started = time.monotonic()
    got = probe_store(
        [ProbeBlob(url, "sha256:" + "a" * 64, 10), ProbeBlob(url, "sha256:" + "a" * 64, 99)],
        tmp_path,
        settings,
    )
    assert got.error.startswith("store probe failed") and not got.store_measured
    assert time.monotonic() - started < 10  # one connection tried, no backoff


def test_the_cache_listing_is_complete_blobs_and_venvs_most_recently_used_first(tmp_path: Path) -> None:
    root = blobs_dir(tmp_path)
    root.mkdir(parents=True)
    names = [_hex(bytes([i])) for i in range(3)]
    for i, name in enumerate(names):
        (root / name).write_bytes(b"x")
        os.utime(root / name, (1000 + i, 1000 + i))
    for junk in (names[0] + ".partial", names[1] + ".fetch", names[1] + ".use", "url-" + names[2]):
        (root / junk).write_bytes(b"")
    built = code_env.venvs_root(tmp_path) / names[0]
    built.mkdir(parents=True)
    (built / code_env.VENV_DONE).write_text("done")
    (code_env.venvs_root(tmp_path) / names[1]).mkdir()  # a build that never completed
    blobs, venvs = cache_listing(tmp_path)
    assert blobs == ["sha256:" + n for n in reversed(names)]
    assert venvs == ["sha256:" + names[0]]
    assert cache_listing(tmp_path, limit=1)[0] == ["sha256:" + names[2]]
