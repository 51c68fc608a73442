"""A region's process restarted or replaced mid-run, between real gRPC servers on loopback: the
survivors stop waiting for the old process as soon as the new one says hello, and the new one,
catching up, takes the state the survivors' rounds without it end on and contributes to the very
round they include it from, at the step they opened it."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import torch
from torch import Tensor

from contracts.sync_config import SyncConfig
from proto.cpn.sync.v1 import sync_pb2
from training.sync.engine import SyncEngine, create_engine
from training.sync.strategies.anchored import AnchoredSync

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
        balance=False,
        timeout_s=TIMEOUT_S,
        startup_timeout_s=30,
    )
    return create_engine(cfg, region=region, total_steps=1000, weight=0.5, theta0=torch.zeros(3))


def survivor(rdv: Path, rounds: int) -> SyncEngine:
    """Region a, ``rounds`` rounds in (as resumed from its checkpoint), its peer b dropped."""
    a = engine("a", rdv)
    a.load_state_dict({"mode": "diloco", "round": rounds, "anchor": torch.zeros(3), "momentum": [None]})
    a.strategy.start(torch.zeros(3), torch.zeros(3))  # type: ignore[union-attr]
    a.joined = True
    a.node.mark_dead("b", "lost")  # type: ignore[union-attr]
    a.node.take_events()  # type: ignore[union-attr]
    return a


def run(eng: SyncEngine, params: Tensor, first: int, last: int) -> None:
    """The training loop's calls into the engine for steps ``first``..``last``."""
    for step in range(first, last + 1):
        if eng.should_sync(step):
            eng.after_step(step, [params])


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


def test_a_rejoiner_catches_up_to_the_round_it_is_included_from_when_a_survivor_opens_it_meanwhile(
    tmp_path: Path,
) -> None:
    # Survivor a has run 7 rounds and opened round 7 (at step 160) without b. b comes back and
    # takes a's state (round 7); a, having opened round 7, includes it from round 8; b tells a it
    # starts at round 8, and a opens round 8 (step 180) before that reaches it. Round 8 then waits
    # for b, so b must take a's state as soon as round 7 is applied (not wait for a's progress,
    # round 8 included: both would wait out their timeouts), and open round 8 at step 180 too.
    a = survivor(tmp_path, rounds=7)
    b = engine("b", tmp_path)
    x, y = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([-3.0, 0.5, 4.0])
    ready_hellos: list[int] = []
    second, go_on = threading.Event(), threading.Event()
    answer = a.node.handle_hello  # type: ignore[union-attr]

    def handle_hello(req: sync_pb2.HelloRequest):  # noqa: ANN202 - the node's own answer
        if req.sender == "b" and req.ready:
            ready_hellos.append(req.next_round)
            if len(ready_hellos) == 2:  # held until a has opened round 8
                second.set()
                go_on.wait(30)
        return answer(req)

    a.node.handle_hello = handle_hello  # type: ignore[union-attr, method-assign]
    joiner = threading.Thread(target=b.after_step, args=(150, [y]))  # its first step: it joins
    try:
        run(a, x, 160, 160)
        assert a.strategy.progress() == (8, 7)  # type: ignore[union-attr]
        joiner.start()
        assert second.wait(30)
        run(a, x, 161, 180)
        assert a.strategy.progress()[0] == 9  # type: ignore[union-attr]  # round 8 open, awaiting b
        go_on.set()
        joiner.join(60)
        assert not joiner.is_alive()
        assert ready_hellos[:2] == [7, 8], ready_hellos
        assert b.strategy.progress() == (8, 8), b.node.take_events()  # type: ignore[union-attr]
        # The runtime moves b on to the step of the state it took; from there b opens round 8 at
        # step 180, as a did, and both apply it with both contributions.
        at = max(150, b.caught_up_step)
        run(b, y, at + 1, 180)
        assert b.strategy.progress()[0] == 9, at  # type: ignore[union-attr]
        for step in range(181, 201):
            run(a, x, step, step)
            run(b, y, step, step)
        sa, sb = a.strategy, b.strategy
        assert isinstance(sa, AnchoredSync) and isinstance(sb, AnchoredSync)
        assert sa.landed.get(8) and sb.landed.get(8), (sa.landed, sb.landed)
        assert torch.equal(sa.anchor, sb.anchor), (sa.anchor, sb.anchor)
        events = a.node.take_events() + b.node.take_events()  # type: ignore[union-attr]
        assert events == ["rejoin b from round 8"], events
    finally:
        go_on.set()
        joiner.join(60)
        for e in (a, b):
            e.node.close()  # type: ignore[union-attr]
