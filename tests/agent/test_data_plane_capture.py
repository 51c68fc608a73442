"""What a wire tap between two nodes captures: a recording TCP relay on loopback sits between a
checkpoint copy's two agents. No tensor's bytes cross in plaintext."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import torch

from agent.checkpoint_transfer import JobCredentials, build_checkpoint_server, run_copy, step_name
from contracts.checkpoint_transfer import CheckpointTicket, CheckpointTls, sign
from contracts.link_probe import new_probe_key
from orchestration.sync_tls import checkpoint_credentials
from tests.agent.relay import recording_relay

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
    assert captured[:1] == b"\x16"  # a TLS handshake record opens the connection
    assert pattern not in captured and pattern[:16] not in captured
