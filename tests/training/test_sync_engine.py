"""The engine end to end with real gRPC between regions, each region a thread with a toy model:
region i pulls its parameters toward its own target, so the regions only agree through sync and
the consensus optimum is the mean target."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from contracts.sync_config import SyncConfig
from contracts.sync_delay import progress_lag_steps
from training.sync.engine import SyncEngine, create_engine

REGIONS = ["a", "b", "c"]
TARGETS = {r: torch.tensor([float(i), -float(i), 2.0 * i]) for i, r in enumerate(REGIONS)}
MEAN = torch.stack(list(TARGETS.values())).mean(0)


def engine(r: str, rdv: Path, steps: int, **sync: Any) -> SyncEngine:
    # The fixed schedule (an overlapped round lands at its delay), blocking unless a case overlaps.
    sync = {"overlap": False, "land_on_arrival": False} | sync
    cfg = SyncConfig(
        peers=dict.fromkeys(REGIONS, ""), rendezvous_dir=str(rdv), timeout_s=3, startup_timeout_s=30, **sync
    )
    return create_engine(cfg, region=r, total_steps=steps, weight=1 / 3, theta0=torch.zeros(3))


def train(
    eng: SyncEngine,
    r: str,
    steps: int,
    log: list,
    start: int = 1,
    stop_at: int | None = None,
    dt: float = 0.004,
    lr: float = 0.1,
    before_step: Callable[[int], None] | None = None,
) -> torch.Tensor:
    x = torch.zeros(3)
    for step in range(start, steps + 1):
        if before_step is not None:
            before_step(step)
        grad = x - TARGETS[r]
        if eng.syncs_gradients(step):
            eng.reduce_gradients(step, [grad])  # in place: the regions' weighted mean
        x -= lr * grad
        time.sleep(dt)  # compute
        if eng.should_sync(step):
            ps = [x]
            eng.after_step(step, ps)
        log.append((step, eng.metrics()))
        if stop_at == step:
            return x
    return x


def run_all(
    tmp_path: Path, steps: int, lr: float = 0.1, **sync: Any
) -> tuple[dict[str, torch.Tensor], dict[str, list]]:
    out: dict[str, torch.Tensor] = {}
    logs: dict[str, list] = {r: [] for r in REGIONS}
    engines = {r: engine(r, tmp_path, steps, **sync) for r in REGIONS}

    def go(r: str) -> None:
        out[r] = train(engines[r], r, steps, logs[r], lr=lr)
        engines[r].close()

    threads = [threading.Thread(target=go, args=(r,)) for r in REGIONS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert set(out) == set(REGIONS)
    return out, logs


def test_sync_averages_gradients_so_regions_follow_one_trajectory(tmp_path: Path) -> None:
    # Gradient descent on the mean of the regions' objectives, computed in one place: the same
    # trajectory, and the regions hold the same bits after every step.
    steps, lr = 30, 0.1
    out, logs = run_all(tmp_path, steps, lr=lr, mode="sync", ring_order=["c", "a", "b"])
    x = torch.zeros(3)
    for _ in range(steps):
        x -= lr * torch.stack([(x - TARGETS[r]) / 3 for r in REGIONS]).sum(0)
    assert torch.equal(out["a"], out["b"]) and torch.equal(out["a"], out["c"])
    assert torch.allclose(out["a"], x, atol=1e-6), (out["a"], x)
    final = [m for _, m in logs["b"] if "replicas_identical" in m]
    assert final and all(m["replicas_identical"] for m in final)
    assert sum(m.get("exchanges", 0) for _, m in logs["a"]) == steps  # one gradient exchange a step


@pytest.mark.parametrize(
    "sync",
    [
        {"mode": "local_sgd", "every": 5, "compression": "topk", "topk_ratio": 0.67},
        {"mode": "diloco", "every": 10, "compression": "int8", "outer_lr": 1.0, "outer_momentum": 0.5},
        {
            "mode": "diloco",
            "every": 10,
            "fragments": 2,
            "overlap": True,
            "overlap_merge": "progress",
            "compression": "bf16",
            "outer_lr": 1.0,
            "outer_momentum": 0.5,
        },
        {
            "mode": "diloco",
            "every": 10,
            "overlap": True,
            "overlap_steps": 1,  # what the control plane gives a link that hides an exchange in a step
            "overlap_merge": "mix",
            "compression": "int8",
            "outer_lr": 1.0,
            "outer_momentum": 0.5,
        },
    ],
    ids=lambda s: "-".join(str(v) for v in s.values()),
)
def test_anchored_modes_end_on_one_model_near_the_consensus(tmp_path: Path, sync: dict[str, Any]) -> None:
    out, logs = run_all(tmp_path, 60, **sync)
    assert torch.equal(out["a"], out["b"]) and torch.equal(out["a"], out["c"])  # bit-identical
    assert torch.allclose(out["a"], MEAN, atol=0.1), out["a"]
    sent = sum(sum(m.get("bytes_sent", {}).values()) for _, m in logs["a"])
    assert sent > 0 and not any(m.get("events") for log in logs.values() for _, m in log if "drop" in str(m))


@pytest.mark.parametrize(
    "sync",
    [
        {"mode": "ssp", "every": 5, "staleness": 1, "compression": "int8"},
        {"mode": "async", "every": 5, "overlap": True, "compression": "int8"},
        {"mode": "gossip", "every": 5},
        {"mode": "gossip", "every": 5, "gossip_protocol": "push_sum", "compression": "bf16"},
    ],
    ids=lambda s: "-".join(str(v) for v in s.values()),
)
def test_loose_modes_pull_regions_toward_the_consensus(tmp_path: Path, sync: dict[str, Any]) -> None:
    # A weak local pull: regions that finish at different times drift little once mixing stops.
    out, _ = run_all(tmp_path, 150, lr=0.03, **sync)
    # Alone, regions a and c would end 4.9 apart (their targets); mixing pulls them together.
    spread = max((out[x] - out[y]).norm() for x in REGIONS for y in REGIONS)
    centre = torch.stack([out[r] for r in REGIONS]).mean(0)
    assert spread < 2.0 and (centre - MEAN).norm() < 0.5, out


@pytest.mark.parametrize("protocol", ["pairwise", "push_sum"])
def test_gossip_ends_on_one_model_and_reports_its_spread(tmp_path: Path, protocol: str) -> None:
    out, logs = run_all(
        tmp_path, 150, lr=0.03, mode="gossip", every=5, gossip_check_every=3, gossip_protocol=protocol
    )
    assert torch.equal(out["a"], out["b"]) and torch.equal(out["a"], out["c"])  # the exact mean
    assert (out["a"] - MEAN).norm() < 0.5, out["a"]
    spreads = [m["gossip_spread"] for _, m in logs["a"] if "gossip_spread" in m]
    assert len(spreads) >= 150 // 5 // 3  # every 3rd round and the last step
    assert all(0 < s < 5 for s in spreads), spreads  # regions pulled toward different targets


def test_gossip_spread_above_the_bound_is_averaged_away(tmp_path: Path) -> None:
    # Every round is checked and the bound is tiny: right after each check the regions are within
    # it (a check above it gives them all the exact mean); plain gossip leaves them ~0.3 apart.
    steps = 40
    engines = {
        r: engine(r, tmp_path, steps, mode="gossip", every=5, gossip_check_every=1, gossip_max_spread=1e-3)
        for r in REGIONS
    }
    after: dict[str, dict[int, torch.Tensor]] = {r: {} for r in REGIONS}

    def go(r: str) -> None:
        x, eng = torch.zeros(3), engines[r]
        for step in range(1, steps + 1):
            x -= 0.03 * (x - TARGETS[r])
            if eng.should_sync(step):
                eng.after_step(step, [x])
                after[r][step] = x.clone()
        eng.close()

    threads = [threading.Thread(target=go, args=(r,)) for r in REGIONS]
    # a reaches its first event first: b and c, out of their start at once and with no barrier
    # before round 1, must not finish round 0 before a has decided its join (a would take them
    # for ahead and catch up, its rounds one event off its steps).
    threads[0].start()
    time.sleep(0.2)
    for t in threads[1:]:
        t.start()
    for t in threads:
        t.join(120)
    assert [engines[r].caught_up_step for r in REGIONS] == [0, 0, 0]  # they started together
    for step in range(10, steps + 1, 5):  # round 0 (step 5) is not a check
        for r in ("b", "c"):
            assert (after["a"][step] - after[r][step]).abs().max() <= 1e-3, (step, after)


def test_metrics_report_bytes_latency_and_blocking(tmp_path: Path) -> None:
    _, logs = run_all(tmp_path, 20, mode="diloco", every=10, overlap=True, compression="int8")
    merged = [m for _, m in logs["b"] if m.get("latency_s") is not None]
    assert merged and all(m["latency_s"] > 0 for m in merged)
    # A ring a -> b -> c -> a (3 regions): b's payloads come from its predecessor and go to its
    # successor; acks and hello calls (tens of bytes each) go both ways.
    for key, main, other in (("bytes_recv", "a", "c"), ("bytes_sent", "c", "a")):
        total: dict[str, int] = {}
        for _, m in logs["b"]:
            for peer, n in m[key].items():
                total[peer] = total.get(peer, 0) + n
        assert set(total) <= {"a", "c"} and total[main] > 2 * total.get(other, 0), (key, total)
    assert all(m["blocked_s"] >= 0 and m["overlapped_s"] >= 0 for _, m in logs["b"])


def test_a_lost_region_is_dropped_and_rejoins_from_a_peer(tmp_path: Path) -> None:
    steps = 150
    engines = {r: engine(r, tmp_path, steps, mode="diloco", every=5) for r in REGIONS}
    logs: dict[str, list] = {r: [] for r in REGIONS}
    out: dict[str, torch.Tensor] = {}

    def go(r: str) -> None:
        out[r] = train(engines[r], r, steps, logs[r], dt=0.03)
        engines[r].close()

    def crash_and_return() -> None:
        train(engines["c"], "c", steps, logs["c"], stop_at=30, dt=0.03)
        engines["c"].node.server.stop(0)  # the process dies: no goodbye
        time.sleep(4)
        back = engines["c2"] = engine("c", tmp_path, steps, mode="diloco", every=5)
        out["c"] = train(back, "c", steps, logs["c"], start=1, stop_at=40, dt=0.03)
        back.close()

    threads = [threading.Thread(target=go, args=(r,)) for r in ("a", "b")]
    threads.append(threading.Thread(target=crash_and_return))
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert set(out) == {"a", "b", "c"}
    # Each survivor sees it from its side of the ring (c's successor only when a probe fails, which
    # can be after c is back): together they dropped c and let it rejoin.
    events = [e for r in ("a", "b") for _, m in logs[r] for e in m.get("events", [])]
    assert any(e.startswith("drop c") for e in events), events
    assert any(e.startswith("rejoin c") for e in events), events
    # The survivors finished on one model, made of the regions' updates only: the targets lie on
    # one line (i · (1, -1, 2)), so every mix of them does too. Where it lands on it depends on
    # when c came back (they no longer wait out timeouts for it, so it may rejoin late in their
    # run): near the mean of a's and b's targets (0.5) if c left for good before their last
    # rounds, near all three's (1) if it took part in many, between or past it (outer momentum
    # carries a round's move on) if it took part in their last few only, and short of 0.5 if it
    # came back late and left with few rounds to go (a slow host's case: its pulls from its own
    # start are still being undone). It stays between a's target (0) and c's (2). The returning
    # region had caught up (adopted the peers' rounds).
    assert torch.equal(out["a"], out["b"]), (out, events)
    scale = float(out["a"][0])
    assert torch.allclose(out["a"], scale * TARGETS["b"], atol=1e-4), out["a"]
    assert 0.0 < scale < 2.0, (out["a"], events)
    assert engines["c2"].strategy.progress()[1] > 5


def test_state_dict_round_trip(tmp_path: Path) -> None:
    e = engine("a", tmp_path / "x", 20, mode="diloco", every=10, compression="int8")
    # No peer ever runs: the nodes are closed directly (an engine's close waits for the peers'
    # leave, up to the timeout).
    try:
        e.strategy.start(torch.zeros(3), torch.zeros(3))
        e.strategy.anchor = torch.tensor([1.0, 2.0, 3.0])
        e.strategy.momentum = [torch.ones(3)]
        e.strategy.completed = e.strategy.opened = 4
        state = e.state_dict()
    finally:
        e.node.close()  # type: ignore[union-attr]
    f = engine("a", tmp_path / "y", 20, mode="diloco", every=10, compression="int8")
    try:
        f.load_state_dict(state)
        assert torch.equal(f.strategy.anchor, torch.tensor([1.0, 2.0, 3.0]))
        assert torch.equal(f.strategy.momentum[0], torch.ones(3)) and f.strategy.progress() == (4, 4)
    finally:
        f.node.close()  # type: ignore[union-attr]


def run_on_arrival(
    tmp_path: Path,
    steps: int,
    every: int,
    delay: int,
    latency_ms: float,
    dt: float,
    arrived: dict[str, dict[int, int]] | None = None,
    merge: str | None = None,
) -> tuple[dict[str, dict[int, int]], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Overlapped DiLoCo landing on arrival: (round -> step applied, final params, final anchor)
    per region. ``arrived`` (given) gets, per region, round -> the first step that found its
    result in before it began; ``merge``: how a late round lands (DiLoCo's default: ``mix``)."""
    links = {f"{x}|{y}": {"latency_ms": latency_ms} for x in REGIONS for y in REGIONS if x < y}
    sync = {"mode": "diloco", "every": every, "overlap": True, "overlap_steps": delay, "links": links}
    sync |= {"overlap_merge": merge} if merge is not None else {}
    sync |= {"compression": "int8", "outer_lr": 1.0, "outer_momentum": 0.5}
    sync |= {"balance": False}  # every region runs the same steps: landings compared step for step
    engines = {}
    for r in REGIONS:
        cfg = SyncConfig(
            peers=dict.fromkeys(REGIONS, ""),
            rendezvous_dir=str(tmp_path),
            timeout_s=5,
            startup_timeout_s=30,
            **sync,
        )
        engines[r] = create_engine(cfg, region=r, total_steps=steps, weight=1 / 3, theta0=torch.zeros(3))
    out: dict[str, torch.Tensor] = {}
    logs: dict[str, list] = {r: [] for r in REGIONS}

    def seen_in(r: str, step: int) -> None:
        for rnd in engines[r].strategy.inflight:  # type: ignore[union-attr]
            if rnd.future.done():
                arrived[r].setdefault(rnd.index, step)  # type: ignore[index]

    def go(r: str) -> None:
        hook = (lambda step: seen_in(r, step)) if arrived is not None else None
        out[r] = train(engines[r], r, steps, logs[r], dt=dt, before_step=hook)

    threads = [threading.Thread(target=go, args=(r,)) for r in REGIONS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    landed = {r: dict(engines[r].strategy.landed) for r in REGIONS}  # type: ignore[union-attr]
    anchors = {r: engines[r].strategy.anchor.clone() for r in REGIONS}  # type: ignore[union-attr]
    # Each region closes on its own, as separate processes would: closed one after another, each
    # would wait out the leave wait for the peers not closed yet.
    closers = [threading.Thread(target=engines[r].close) for r in REGIONS]
    for t in closers:
        t.start()
    for t in closers:
        t.join(30)
    return landed, out, anchors


def test_an_overlapped_round_lands_when_it_arrives_without_waiting_at_its_delay(tmp_path: Path) -> None:
    # 20 ms a hop: a ring round (4 hops) takes ~8 steps of 10 ms, far more than the 1-step delay.
    # No region waits at the delay: each applies the round on its own at the first step its result
    # is in (on a quiet host long before the next round opens; a busy one may hold the exchange
    # longer, and then it lands where the next round opens); the anchors stay equal and the run ends
    # on one model.
    steps, every, delay = 160, 40, 1
    arrived: dict[str, dict[int, int]] = {r: {} for r in REGIONS}
    landed, out, anchors = run_on_arrival(
        tmp_path, steps, every, delay=delay, latency_ms=20, dt=0.01, arrived=arrived
    )
    for r in REGIONS:
        assert sorted(landed[r]) == [0, 1, 2], landed
        for k, step in landed[r].items():
            opened = every * (k + 1)
            assert opened + delay <= step <= opened + every, landed
            if k in arrived[r] and arrived[r][k] <= opened + every:  # seen in before a step began
                assert step == max(opened + delay, arrived[r][k]), (r, k, step, arrived)
    assert torch.equal(anchors["a"], anchors["b"]) and torch.equal(anchors["a"], anchors["c"])
    assert torch.equal(out["a"], out["b"]) and torch.equal(out["a"], out["c"])
    # On the line of the regions' targets, near their mean: how near depends on how much local
    # progress each landing carried, which the host's timing sets (0.93 of the way seen on a
    # busy host, where a round landed later).
    scale = float(out["a"][0])
    assert torch.allclose(out["a"], scale * MEAN, atol=1e-4) and 0.8 < scale < 1.2, out["a"]


def test_a_round_that_keeps_the_local_progress_is_waited_for_at_its_lag_bound(tmp_path: Path) -> None:
    # The same ~8-step exchange under the ``progress`` merge: a round keeping the progress made
    # meanwhile lands no later than a tenth of its round (4 of 40 steps), waited for there, where
    # ``mix`` (above) lands it whenever it comes; the anchors stay equal and the run ends on one model.
    steps, every = 160, 40
    bound = progress_lag_steps(every)
    landed, out, anchors = run_on_arrival(
        tmp_path, steps, every, delay=1, latency_ms=20, dt=0.01, merge="progress"
    )
    for r in REGIONS:
        assert sorted(landed[r]) == [0, 1, 2], landed
        for k, step in landed[r].items():
            opened = every * (k + 1)
            assert opened + 1 <= step <= opened + bound, landed
    assert torch.equal(anchors["a"], anchors["b"]) and torch.equal(anchors["a"], anchors["c"])
    assert torch.equal(out["a"], out["b"]) and torch.equal(out["a"], out["c"])


def test_a_round_still_in_flight_when_the_next_opens_is_waited_for_there(tmp_path: Path) -> None:
    # Rounds of 4 steps against an exchange of ~8: each round is applied where the next one opens
    # (its pseudo-gradient needs the new anchor), on every region alike.
    steps, every = 40, 4
    landed, out, anchors = run_on_arrival(tmp_path, steps, every, delay=1, latency_ms=20, dt=0.01)
    for r in REGIONS:
        assert landed[r] == {k: every * (k + 2) for k in range(steps // every - 1)}, landed
    assert torch.equal(out["a"], out["b"]) and torch.equal(out["a"], out["c"])
    assert torch.equal(anchors["a"], anchors["c"])


def test_a_result_in_early_is_not_applied_before_the_delay(tmp_path: Path) -> None:
    # On loopback a round's result is in well before its 3 steps of 30 ms on a quiet host; on a
    # busy one it may come later, and then lands where it comes. Either way: never before the
    # delay, exactly at it when the result was in by then, and before the next round opens.
    steps, every, delay = 60, 20, 3
    arrived: dict[str, dict[int, int]] = {r: {} for r in REGIONS}
    landed, out, _ = run_on_arrival(
        tmp_path, steps, every, delay=delay, latency_ms=0.0, dt=0.03, arrived=arrived
    )
    for r in REGIONS:
        assert len(landed[r]) == steps // every - 1, landed  # the last round is the final blocking one
        for k, step in landed[r].items():
            due = every * (k + 1) + delay
            assert due <= step < every * (k + 2), (r, k, step, landed)
            if arrived[r].get(k, due + 1) <= due:
                assert step == due, (r, k, step, arrived)
    assert torch.equal(out["a"], out["b"]) and torch.equal(out["a"], out["c"])


@pytest.mark.parametrize("regions", [["a", "b"], ["a", "b", "c"]])
def test_gossip_end_meets_when_round_counters_differ(tmp_path: Path, regions: list[str]) -> None:
    # A region that took a peer's state at its join holds the peer's round counter as of the pull,
    # which can be a round ahead of what the others count at the same step. The run ends on a round
    # start (20 = 4 * 5): the final mean must still meet at once, not after the start-up timeout.
    steps = 20
    engines = {}
    for r in regions:
        cfg = SyncConfig(
            peers=dict.fromkeys(regions, ""),
            rendezvous_dir=str(tmp_path),
            timeout_s=3,
            startup_timeout_s=30,
            mode="gossip",
            every=5,
        )
        engines[r] = create_engine(
            cfg, region=r, total_steps=steps, weight=1 / len(regions), theta0=torch.zeros(3)
        )
    out: dict[str, torch.Tensor] = {}
    ended: dict[str, float] = {}

    def go(r: str) -> None:
        x, eng = torch.zeros(3), engines[r]
        for step in range(1, steps + 1):
            x -= 0.1 * (x - TARGETS[r])
            if eng.should_sync(step):
                t0 = time.monotonic()
                eng.after_step(step, [x])
                if step == 1 and r == regions[-1]:
                    eng.strategy.rounds += 1  # type: ignore[union-attr]  # as a late pull leaves it
                if step == steps:
                    ended[r] = time.monotonic() - t0
        eng.close()
        out[r] = x

    threads = [threading.Thread(target=go, args=(r,)) for r in regions]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    events = {r: engines[r].node.take_events() for r in regions}  # type: ignore[union-attr]
    assert set(out) == set(regions), (ended, events)
    assert max(ended.values()) < 10, ended  # not the 30 s start-up timeout
    assert all(torch.equal(out[regions[0]], out[r]) for r in regions), (out, events)


def test_gossip_state_reports_the_step_its_round_counter_is_as_of(tmp_path: Path) -> None:
    # A region taking this state resumes at the step it reports, with its round counter: the two
    # must be of one moment even while the exporting region is inside its next event.
    engines = {r: engine(r, tmp_path, 20, mode="gossip", every=5, gossip_check_every=1) for r in REGIONS}

    def go(r: str) -> None:
        x, eng = torch.zeros(3), engines[r]
        for step in range(1, 15):  # every round a check (a barrier): all three stay together
            if eng.should_sync(step):
                eng.after_step(step, [x])

    threads = [threading.Thread(target=go, args=(r,)) for r in REGIONS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    # Region a opens round 2 at step 15; its check waits for b and c, which open it only once the
    # state is taken: a is inside its event all along.
    inside = threading.Thread(target=engines["a"].after_step, args=(15, [torch.zeros(3)]))
    inside.start()
    time.sleep(0.5)
    state = engines["a"].strategy.export_state(0, timeout=1)  # type: ignore[union-attr]
    assert inside.is_alive()
    rest = [threading.Thread(target=engines[r].after_step, args=(15, [torch.zeros(3)])) for r in ("b", "c")]
    for t in rest:
        t.start()
    for t in [inside, *rest]:
        t.join(30)
    assert (state.meta.step, state.meta.round) == (10, 2)
    for eng in engines.values():
        eng.node.close()  # type: ignore[union-attr]


def test_a_region_that_leaves_first_hears_the_others_leave(tmp_path: Path) -> None:
    # A finished region waits for every live peer's leave before closing its connections; the
    # peers that finish later must tell it too, or it waits out the whole leave wait (it was 5 s
    # at the end of every multi-region job).
    steps = 10
    engines = {r: engine(r, tmp_path, steps, mode="local_sgd", every=5) for r in REGIONS}
    logs: dict[str, list] = {r: [] for r in REGIONS}

    def go(r: str, delay: float) -> None:
        train(engines[r], r, steps, logs[r])
        time.sleep(delay)  # "a" leaves first, "c" last
        engines[r].close()

    threads = [threading.Thread(target=go, args=(r, 0.3 * i)) for i, r in enumerate(REGIONS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for r, eng in engines.items():
        assert eng.node is not None
        assert eng.node.left == set(REGIONS) - {r}, r
