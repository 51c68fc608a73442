"""A region's process restarted or replaced mid-run, between real gRPC servers on loopback: the
survivors stop waiting for the old process as soon as the new one says hello."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from contracts.sync_config import SyncConfig
from training.sync.engine import SyncEngine

H = 20  # steps per round: round k opens at step H * (k + 1)
TIMEOUT_S = 10.0


def engine(region: str, rdv: Path) -> SyncEngine:
    """A region's leader as the job path runs it: DiLoCo overlapped, landing on arrival."""
    cfg = SyncConfig(
        peers=dict.fromkeys(["a", "b"], ""),
        rendezvous_dir=str(rdv),
        mode="diloco",
        every=H,
        overlap=True,
        overlap_steps=2,
        timeout_s=TIMEOUT_S,
        startup_timeout_s=30,
    )
    return SyncEngine(
        cfg,
        region=region,
        is_leader=True,
        total_steps=1000,
        weight=0.5,
        theta0=torch.zeros(3),
        land_on_arrival=True,
    )


def hello(eng: SyncEngine, ready: bool, next_round: int = 0) -> None:
    eng.node.hello_all(ready=ready, next_round=next_round, step=1, deadline=time.monotonic() + TIMEOUT_S)  # type: ignore[union-attr]


def test_a_restarted_peers_hello_drops_its_old_process_and_the_rounds_it_had_open(tmp_path: Path) -> None:
    a, old = engine("a", tmp_path), engine("b", tmp_path)
    new = None
    try:
        for e in (a, old):
            e.strategy.start(torch.zeros(3), torch.zeros(3))  # type: ignore[union-attr]
        hello(old, ready=True)
        assert a.node.is_alive("b")  # type: ignore[union-attr]
        old.node.server.stop(0)  # type: ignore[union-attr]  # killed: no goodbye
        new = engine("b", tmp_path)  # started again: another port
        new.strategy.start(torch.zeros(3), torch.zeros(3))  # type: ignore[union-attr]
        hello(new, ready=False)  # its first words, before it catches up
        # Gone with every round it had open: the new process answers a liveness check, but it
        # will contribute only from the round it is admitted to.
        assert not a.node.is_alive("b"), a.node.take_events()  # type: ignore[union-attr]
        got = a.node.collect("anchored0", 0, ["b"], time.monotonic() + TIMEOUT_S, mark_missing=False)  # type: ignore[union-attr]
        assert got == {}
        ev = a.node.take_events()  # type: ignore[union-attr]
        assert any(e.startswith("drop b: restarted") for e in ev), ev
        # Its ready hello admits it again, as any rejoining region.
        status = new.node.hello_all(  # type: ignore[union-attr]
            ready=True, next_round=0, step=1, deadline=time.monotonic() + TIMEOUT_S
        )
        assert status["a"].accepted and a.node.is_alive("b")  # type: ignore[union-attr]
        assert a.node.take_events() == ["rejoin b from round 0"]  # type: ignore[union-attr]
        # A liveness check of a peer (its hello gives the same address) drops nobody.
        assert not new.node.is_gone("a") and a.node.is_alive("b")  # type: ignore[union-attr]
        assert a.node.take_events() == []  # type: ignore[union-attr]
    finally:
        for e in (a, old, new):
            if e is not None:
                e.node.close()  # type: ignore[union-attr]
