"""The sync engine as a user's loop drives it (``create_engine``): a real job's defaults, misuse as an
error, and plaintext only where the config asks for it. Regions are threads talking real gRPC."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from contracts.errors import FailedPrecondition, InvalidArgument
from contracts.sync_config import SyncConfig
from contracts.sync_delay import overlap_delay_steps
from training.sync import create_engine
from training.sync.engine import SyncEngine

TARGETS = {"a": torch.tensor([1.0, -1.0, 2.0]), "b": torch.tensor([-1.0, 3.0, 0.0])}


def pair(tmp_path: Path, steps: int, **sync: Any) -> dict[str, SyncEngine]:
    cfg = SyncConfig(
        peers=dict.fromkeys(TARGETS, ""),
        rendezvous_dir=str(tmp_path),
        timeout_s=5,
        startup_timeout_s=30,
        **sync,
    )
    return {r: create_engine(cfg, region=r, total_steps=steps, theta0=torch.zeros(3)) for r in TARGETS}


def run_pair(
    engines: dict[str, SyncEngine], loop: Callable[[str, SyncEngine], None]
) -> dict[str, BaseException]:
    """Each region's loop in its own thread, then its close; what each raised."""
    errors: dict[str, BaseException] = {}

    def go(r: str) -> None:
        try:
            loop(r, engines[r])
        except Exception as e:  # noqa: BLE001 - what the region's loop raised is the outcome
            errors[r] = e
        finally:
            engines[r].close()

    threads = [threading.Thread(target=go, args=(r,)) for r in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    return errors


# ------------------------------------------------------------ one constructor, a real job's defaults


def test_a_hand_built_config_gets_a_real_jobs_defaults() -> None:
    # What control_layer.worker_config gives a DiLoCo job: overlap with Streaming DiLoCo's merge, the
    # planner's delay (without link figures: half a round), landing on arrival and balanced rounds
    # where the region is one process; all of it in the engine's config and its repr.
    eng = create_engine(
        SyncConfig(mode="diloco", every=20, peers={"a": "", "b": ""}),
        region="a",
        is_leader=False,
        total_steps=100,
    )
    cfg = eng.cfg
    assert (cfg.overlap, cfg.overlap_merge, cfg.overlap_steps) == (True, "mix", overlap_delay_steps(20))
    assert (cfg.land_on_arrival, cfg.balance) == (True, True)
    assert (
        "overlap_merge='mix'" in repr(cfg)
        and "balance=True" in repr(cfg)
        and "land_on_arrival=True" in repr(cfg)
    )
    # A region of several processes cannot follow landings or balanced ends its leader alone knows.
    multi = create_engine(
        SyncConfig(mode="local_sgd", peers={"a": "", "b": ""}),
        region="a",
        is_leader=False,
        ranks=4,
        total_steps=10,
    )
    assert (multi.cfg.overlap, multi.cfg.land_on_arrival, multi.cfg.balance) == (False, False, False)
    # Blocking modes stay blocking; async overlaps, as the planner has it.
    assert SyncConfig(mode="sync").overlap is False and SyncConfig(mode="async").overlap is True


def test_the_delay_rule_is_the_planners() -> None:
    from control_layer.planner.sync_settings import exchange_delay

    cases = [
        (0.3, 0.1),
        (0.0, 1.0),
        (5.0, 0.001),
        (float("inf"), 0.1),
        (0.3, 0.0),
        (0.25, 0.05),
        (2.0, 1e-300),
    ]
    for exchange_s, step_s in cases:
        assert overlap_delay_steps(20, exchange_s, step_s) == int(exchange_delay(20, exchange_s, step_s))
    exchange, step = zip(*cases, strict=True)  # the planner's arrays, one per placement
    assert exchange_delay(20, list(exchange), list(step)).tolist() == [
        overlap_delay_steps(20, e, s) for e, s in cases
    ]


def test_settings_that_cannot_hold_together_are_refused_by_name() -> None:
    peers = {"a": "", "b": ""}
    with pytest.raises(InvalidArgument, match="balance=True needs land_on_arrival"):
        create_engine(
            SyncConfig(mode="diloco", balance=True, peers=peers),
            region="a",
            is_leader=False,
            ranks=2,
            total_steps=10,
        )
    with pytest.raises(InvalidArgument, match="land_on_arrival needs"):
        create_engine(
            SyncConfig(mode="diloco", land_on_arrival=True, peers=peers),
            region="a",
            is_leader=False,
            ranks=2,
            total_steps=10,
        )
    with pytest.raises(InvalidArgument, match="create_engine"):
        SyncEngine(
            SyncConfig(mode="diloco", peers=peers),
            region="a",
            is_leader=False,
            total_steps=10,
            weight=0.5,
            theta0=None,
        )


# ------------------------------------------------------------ misuse is an error


def test_sync_mode_without_reduce_gradients_fails_at_the_first_step(tmp_path: Path) -> None:
    # A loop that calls only after_step, as the other modes do: each region would step on its own
    # gradients. It fails at step 1, naming the call to make.
    engines = pair(tmp_path, 5, mode="sync")

    def loop(r: str, eng: SyncEngine) -> None:
        x = torch.zeros(3)
        for step in range(1, 6):
            x -= 0.1 * (x - TARGETS[r])
            if eng.should_sync(step):
                eng.after_step(step, [x])

    errors = run_pair(engines, loop)
    assert set(errors) == {"a", "b"}
    for e in errors.values():
        assert isinstance(e, FailedPrecondition) and "reduce_gradients" in e.message and "step 1" in e.message
    # Neither exchanged anything, so neither waits for the other to leave before it closes: a
    # failed job's workers exit at once (with the whole wait, an hour here, this would not end).
    for eng in engines.values():
        assert eng.node is not None
        eng.node.wait_all_left(3600.0, contacted_only=True)


def test_a_mode_specific_hook_in_another_mode_raises() -> None:
    eng = create_engine(
        SyncConfig(mode="local_sgd", peers={"a": "", "b": ""}), region="a", is_leader=False, total_steps=10
    )
    assert not eng.syncs_gradients(1)
    with pytest.raises(FailedPrecondition, match="reduce_gradients is the 'sync' mode's hook"):
        eng.reduce_gradients(1, [torch.zeros(3)])


def test_replicas_that_diverge_in_sync_mode_fail_the_run_with_the_step(tmp_path: Path) -> None:
    # Region b changes its parameters outside the averaged gradient at step 3: the check at the
    # last step finds the replicas apart and fails the run in both regions, naming the step.
    steps = 6
    engines = pair(tmp_path, steps, mode="sync")

    def loop(r: str, eng: SyncEngine) -> None:
        x = torch.zeros(3)
        for step in range(1, steps + 1):
            grad = x - TARGETS[r]
            eng.reduce_gradients(step, [grad])
            x -= 0.1 * grad
            if r == "b" and step == 3:
                x += 1.0
            if eng.should_sync(step):
                eng.after_step(step, [x])

    errors = run_pair(engines, loop)
    assert set(errors) == {"a", "b"}
    for e in errors.values():
        assert isinstance(e, FailedPrecondition) and "differ at step 6" in e.message
        assert e.details["step"] == steps


def test_a_loop_past_its_balanced_share_fails_naming_local_steps(tmp_path: Path) -> None:
    # Balanced rounds (a real job's default) give the slower region fewer steps. A loop that runs
    # the job's step count regardless would train steps no round averages: it fails, naming
    # engine.local_steps. The faster region's loop, ending short of its share, is left alone.
    steps = 40
    engines = pair(tmp_path, steps, mode="local_sgd", every=5)
    pace = {"a": 0.02, "b": 0.002}  # a is ten times slower

    def loop(r: str, eng: SyncEngine) -> None:
        x = torch.zeros(3)
        for step in range(1, steps + 1):
            x -= 0.1 * (x - TARGETS[r])
            time.sleep(pace[r])  # compute
            if eng.should_sync(step):
                eng.after_step(step, [x])

    errors = run_pair(engines, loop)
    e = errors.get("a")
    assert isinstance(e, FailedPrecondition) and "engine.local_steps(40)" in e.message, errors


def test_balanced_totals_say_how_many_steps_each_region_trained(tmp_path: Path) -> None:
    steps = 40
    engines = pair(tmp_path, steps, mode="local_sgd", every=5)
    pace = {"a": 0.02, "b": 0.002}
    trained: dict[str, int] = {}

    def loop(r: str, eng: SyncEngine) -> None:
        x, step = torch.zeros(3), 0
        while step < eng.local_steps(steps):
            step += 1
            x -= 0.1 * (x - TARGETS[r])
            time.sleep(pace[r])
            if eng.should_sync(step):
                eng.after_step(step, [x])
        trained[r] = step

    assert run_pair(engines, loop) == {}
    totals = {r: engines[r].totals() for r in engines}
    assert {r: t["local_steps"] for r, t in totals.items()} == trained
    assert sum(trained.values()) == 2 * steps and trained["a"] < trained["b"]


# ------------------------------------------------------------ secure unless told otherwise


def test_an_engine_without_tls_refuses_addresses_off_loopback() -> None:
    cfg = SyncConfig(mode="diloco", listen="0.0.0.0:0", peers={"a": "", "b": "192.0.2.7:7000"})
    with pytest.raises(FailedPrecondition, match="insecure=True"):
        create_engine(cfg, region="a", total_steps=10)


def test_insecure_runs_off_loopback_warn_once_and_say_so(caplog: pytest.LogCaptureFixture) -> None:
    # Told to: it starts, warns once however many engines the process builds, and its totals say so.
    import training.sync.exposure as exposure

    exposure._warned = False
    cfg = SyncConfig(mode="diloco", peers={"a": "", "b": "192.0.2.7:7000"}, insecure=True, timeout_s=1)
    with caplog.at_level(logging.WARNING, logger="training.sync.exposure"):
        engines = [create_engine(cfg, region="a", total_steps=10) for _ in range(2)]
    try:
        assert all(e.totals()["insecure"] is True for e in engines)
    finally:
        for e in engines:
            e.close()
    warned = [r for r in caplog.records if "insecure=True" in r.getMessage()]
    assert len(warned) == 1 and "192.0.2.7:7000" in warned[0].getMessage()
