"""What a wire tap between two nodes captures: a recording TCP relay on loopback sits between a
checkpoint copy's two agents, and between the nodes of a torchrun group at its rendezvous. No
tensor's bytes, and no store key, cross in plaintext; a process without the job's credentials
neither fetches the checkpoint nor joins the group."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import secrets
import signal
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from agent.checkpoint_transfer import JobCredentials, build_checkpoint_server, run_copy, step_name
from agent.workers import rendezvous_args
from contracts.checkpoint_transfer import CheckpointTicket, CheckpointTls, sign
from contracts.link_probe import new_probe_key
from orchestration.sync_tls import checkpoint_credentials, group_credentials
from tests.agent.relay import recording_relay
from tests.processes import free_port
from training.rendezvous import GroupCredentials, Relay

REPO = Path(__file__).resolve().parents[2]

SECRET = "the-jobs-sync-secret"
JOB = "job7"
DIR = f"checkpoints/{JOB}/eu-west"


def _tensor() -> torch.Tensor:
    """Weights with a byte pattern nothing else on the wire has."""
    return torch.arange(1 << 16, dtype=torch.float32).mul_(0.7310585786)


def _pattern(t: torch.Tensor) -> bytes:
    return t.numpy().tobytes()[4000:4048]


def test_a_checkpoint_copy_crosses_the_wire_encrypted(tmp_path: Path) -> None:
    src, dst, key = tmp_path / "src", tmp_path / "dst", new_probe_key()
    step = src / DIR / step_name(40)
    step.mkdir(parents=True)
    weights = _tensor()
    torch.save({"model": {"w": weights}}, step / "__0_0.distcp")
    (step / "COMPLETE").write_text("40")
    pattern = _pattern(weights)
    assert pattern in (step / "__0_0.distcp").read_bytes()  # the file holds it as it is
    held = JobCredentials(src)
    held.add(JOB, CheckpointTls(**checkpoint_credentials(SECRET, JOB, "node-src")))
    mine = CheckpointTls(**checkpoint_credentials(SECRET, JOB, "node-dst"))
    ticket = sign(key, CheckpointTicket("t1", "node-src", DIR, 40, 1 << 30, float(int(time.time() + 120))))

    async def go() -> tuple[tuple[int, float, str], bytes]:
        server, port = build_checkpoint_server(lambda: ("node-src", key), src, held, "127.0.0.1", 0)
        await server.start()
        try:
            async with recording_relay("127.0.0.1", port) as tap:
                result = await run_copy(dst, ticket, "127.0.0.1", tap.port, mine)
                return result, tap.captured
        finally:
            await server.stop(0)

    (moved, _, error), captured = asyncio.run(go())
    assert error == "" and moved > weights.numel() * 4
    assert (dst / DIR / step_name(40) / "__0_0.distcp").read_bytes() == (step / "__0_0.distcp").read_bytes()
    assert len(captured) > moved  # every byte of the copy went through the tap
    assert pattern not in captured and pattern[:16] not in captured
    assert captured[:1] == b"\x16"  # a TLS handshake record opens the connection


def _group(rank: int, port: int, holder: str, secret: str, job: str = JOB) -> dict:
    """A node's ``group`` section as ``control_layer.allocation.add_job_credentials`` fills it."""
    creds = group_credentials(SECRET, job, holder)
    return (
        {"nnodes": 2, "node_rank": rank, "master_addr": "127.0.0.1", "master_port": port}
        | creds
        | {"store_secret": secret}
    )


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _store_client(port: int) -> str:
    try:
        store = dist.TCPStore("127.0.0.1", port, None, False, dt.timedelta(seconds=3))
        return f"joined: {store.num_keys()} keys"
    except (RuntimeError, dist.DistStoreError) as exc:
        return f"refused: {type(exc).__name__}"


def _stranger_joins(port: int, ca_pem: str) -> dict[str, str]:
    """What a process without the job's credentials gets at the group's port: torch's own store
    client, and the same through a member's relay holding another job's certificate (it knows the
    job's CA certificate, which is no secret, so it trusts the head: does the head trust it?)."""
    out = {"plain store client": _store_client(port)}
    other = group_credentials(SECRET, "another-job", "intruder")
    theirs = GroupCredentials(ca_pem, other["tls_cert_pem"], other["tls_key_pem"], "0" * 64)
    relay = Relay()
    try:
        local = relay.serve_member("127.0.0.1", port, theirs.context(server=False), relay.clock() + 3)
        out["other job's certificate"] = _store_client(local)
    finally:
        relay.close()
    return out


def test_a_groups_rendezvous_across_nodes_is_encrypted_and_refuses_strangers(tmp_path: Path) -> None:
    """Two launchers as the agents start them (``rendezvous_args``), node rank 1 reaching the head
    through the tap: the group forms and all-reduces; the tap saw TLS only, neither the store's
    keys nor the job's store secret; a process without the job's credentials is refused at the
    group's port while the group runs."""
    port, secret, go = free_port(), secrets.token_hex(32), tmp_path / "go"

    async def run() -> tuple[list[tuple[int, str]], bytes, dict[str, str]]:
        async with recording_relay("127.0.0.1", port) as tap:
            procs = []
            for rank, target in ((0, port), (1, tap.port)):
                config = tmp_path / f"node{rank}.json"
                config.write_text(json.dumps({"group": _group(rank, target, f"node{rank}", secret)}))
                launcher, args = rendezvous_args(json.loads(config.read_text())["group"], JOB)
                assert launcher == "training.launch"
                cmd = [
                    sys.executable,
                    "-m",
                    launcher,
                    *args,
                    "--nproc-per-node",
                    "1",
                    "-m",
                    "tests.agent.group_worker",
                ]
                env = os.environ | {
                    "PYTHONPATH": str(REPO),
                    "CPN_WORKER_CONFIG": str(config),
                    "CPN_TEST_GO": str(go),
                    "OMP_NUM_THREADS": "1",
                }
                procs.append(
                    await asyncio.create_subprocess_exec(
                        *cmd,
                        cwd=REPO,
                        env=env,
                        stdout=asyncio.subprocess.PIPE,
                        stderr=asyncio.subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
            outputs = [asyncio.create_task(p.communicate()) for p in procs]  # read as they write
            try:
                while not _listening(port):  # the head's relay is up once its launcher rendezvoused
                    if any(p.returncode is not None for p in procs):
                        break
                    await asyncio.sleep(0.1)
                ca = json.loads((tmp_path / "node0.json").read_text())["group"]["tls_ca_pem"]
                strangers = await asyncio.to_thread(_stranger_joins, port, ca)
                go.touch()
                outs = await asyncio.wait_for(asyncio.gather(*outputs), 240)
                codes = [(p.returncode or 0, o[0].decode()) for p, o in zip(procs, outs, strict=True)]
                return codes, tap.captured, strangers
            finally:
                for p in procs:
                    if p.returncode is None:
                        os.killpg(p.pid, signal.SIGKILL)
                        await p.wait()

    results, captured, strangers = asyncio.run(run())
    for code, out in results:
        assert code == 0, out[-3000:]
        assert "CPN_TEST_SUM 3 " in out, out[-3000:]  # 1 + 2 over the two nodes
    assert len(strangers) == 2 and all(v.startswith("refused") for v in strangers.values()), strangers
    for plain in (secret.encode(), b"default_pg", b"torchelastic", b"/worker", b"cpn/"):
        assert plain not in captured, plain
    assert captured[:1] == b"\x16" and len(captured) > 2000  # the store's traffic, in TLS records
