"""Work balancing for round-based sync: the split rule (property tests), the round plan, and real
worker processes where one region is slowed on purpose."""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.sync_config import SyncConfig
from tests.training.sync_launch import region_configs, start_region
from training.sync import create_engine
from training.sync.algorithms.balance import split_round
from training.sync.algorithms.round_plan import MAX_MID_SPLITS, RoundPlan

NAMES = ["a", "b", "c", "d", "e", "f"]
paces = st.floats(min_value=1e-3, max_value=10.0, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(st.lists(paces, min_size=1, max_size=6), st.integers(1, 200), st.data())
def test_split_sums_exactly_gives_every_region_a_step_and_follows_speed(
    step_s: list[float], h: int, data: st.DataObject
) -> None:
    regions = NAMES[: len(step_s)]
    pace = dict(zip(regions, step_s, strict=True))
    total = h * len(regions)
    split = split_round(dict.fromkeys(regions, 100.0), pace, total)
    assert sum(split.values()) == total
    assert all(n >= 1 for n in split.values())
    for a in regions:  # monotone: a faster region never gets fewer steps
        for b in regions:
            if pace[a] < pace[b]:
                assert split[a] >= split[b], (pace, split)
    # deterministic: the same figures in any order give the same split
    order = data.draw(st.permutations(regions))
    assert split_round({r: 100.0 for r in order}, {r: pace[r] for r in order}, total) == split


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(paces, st.floats(0, 50)), min_size=2, max_size=6), st.integers(1, 100))
def test_split_with_late_starters_still_sums_and_ends_together(
    figs: list[tuple[float, float]], h: int
) -> None:
    regions = NAMES[: len(figs)]
    pace = {r: s for r, (s, _) in zip(regions, figs, strict=True)}
    arrive = {r: a for r, (_, a) in zip(regions, figs, strict=True)}
    total = h * len(regions)
    split = split_round(arrive, pace, total)
    assert sum(split.values()) == total and all(n >= 1 for n in split.values())
    ends = {r: arrive[r] + split[r] * pace[r] for r in regions}
    # Every region above the 1-step floor ends within one of its own steps of the latest end of
    # the regions that got more than one step (integers allow no closer).
    free = [r for r in regions if split[r] > 1]
    if len(free) >= 2:
        latest = max(ends[r] for r in free)
        for r in free:
            assert ends[r] >= latest - max(pace[x] for x in free) - 1e-9 * latest


def test_split_is_even_without_usable_figures() -> None:
    assert split_round({"a": 0, "b": 0}, {"a": 0.0, "b": 1.0}, 40) == {"a": 20, "b": 20}
    with pytest.raises(ValueError, match="cannot split"):
        split_round({"a": 0, "b": 0}, {"a": 1.0, "b": 1.0}, 1)


def test_plan_keeps_the_jobs_total_and_maps_steps_onto_the_job_axis() -> None:
    # region a twice as fast as b: round 1, re-split from round 0's figures (the times the
    # regions began it), also makes up the 1 s b fell behind in the fixed round 0; later rounds
    # give a about twice b's steps; each round's total stays 2 x 10 and a's learning-rate axis
    # still ends at the job's 50 steps
    plans = {r: RoundPlan(r, 10, 50) for r in ("a", "b")}
    pace = {"a": 0.1, "b": 0.2}
    t = {"a": 0.0, "b": 0.0}
    done = {"a": 0, "b": 0}
    for rnd in range(5):
        for r, p in plans.items():
            h = p.end(rnd) - p.start(rnd)
            t[r] += h * pace[r]
            done[r] += h
        figs = {r: (t[r], pace[r]) for r in plans}
        for p in plans.values():
            p.on_figures(rnd, figs)
    assert done["a"] + done["b"] == 100
    assert plans["a"].splits == plans["b"].splits
    assert plans["a"].splits[1] == {"a": 17, "b": 3} and plans["a"].splits[4] == {"a": 14, "b": 6}
    assert plans["a"].resplit == {1, 2, 3, 4}
    assert abs(t["a"] - t["b"]) <= 0.2 + 1e-9  # within one of the slower region's steps at the end
    # every round from 1 on ends within one of b's steps in both regions (a fixed round 1 would
    # leave b 1 s behind and round 2, planned from round 0 alone, would overshoot)
    a = plans["a"]
    assert a.local_steps() == done["a"]
    assert a.job_step(0) == 0 and a.job_step(a.local_steps()) == 50
    assert a.job_step(a.end(2)) == 30


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(paces, st.floats(0, 50)), min_size=1, max_size=6), st.integers(1, 60), st.data())
def test_split_gives_every_region_at_least_the_floor(
    figs: list[tuple[float, float]], h: int, data: st.DataObject
) -> None:
    regions = NAMES[: len(figs)]
    least = data.draw(st.integers(1, h))
    split = split_round(
        {r: a for r, (_, a) in zip(regions, figs, strict=True)},
        {r: s for r, (s, _) in zip(regions, figs, strict=True)},
        h * len(regions),
        least,
    )
    assert sum(split.values()) == h * len(regions) and min(split.values()) >= least
    with pytest.raises(ValueError, match="cannot split"):
        split_round(dict.fromkeys(regions, 0.0), dict.fromkeys(regions, 1.0), h * len(regions), h + 1)


def test_the_running_round_is_re_split_and_a_region_past_its_new_end_stops_there() -> None:
    # Round 0's figures land 3 steps into round 1: b began round 1 1 s after a and runs half as
    # fast, so round 1 is re-split 17 / 3 (ends together), with a floor of 4 steps: 16 / 4.
    figs = {"a": (1.0, 0.1), "b": (2.0, 0.2)}
    a, b = RoundPlan("a", 10, 50), RoundPlan("b", 10, 50)
    a.on_figures(0, figs, now=13, least=4)
    b.on_figures(0, figs, now=13, least=4)
    assert a.splits[1] == b.splits[1] == {"a": 16, "b": 4}
    assert (a.end(1), b.end(1)) == (26, 14)
    # round 2 follows the new ends: a starts it at 1 + 1.6 s, b at 2 + 0.8 s
    assert a.splits[2] == b.splits[2] and a.end(2) - a.end(1) == a.splits[2]["a"]
    # the same figures landing once b is already 15 steps in: b ends round 1 where it is
    late = RoundPlan("b", 10, 50)
    late.on_figures(0, figs, now=15, least=4)
    assert late.end(1) == 15 and late.splits[1] == {"a": 16, "b": 4}
    # a round is re-split once: figures for it coming again (a catch-up) leave it as it is
    a.on_figures(0, {"a": (1.0, 0.2), "b": (1.0, 0.1)}, now=14, least=4)
    assert a.end(1) == 26


def test_a_region_without_figures_keeps_every_region_on_the_fixed_plan() -> None:
    # a peer that does not balance sends no figures (step_s 0): it runs the fixed size, so must we
    p = RoundPlan("a", 10, 50)
    p.on_figures(0, {"a": (1.0, 0.1), "b": (2.0, 0.0)})
    assert p.end(2) == 30 and 2 not in p.splits


def test_the_final_round_is_split_again_halfway_from_the_same_figures_everywhere() -> None:
    # Rounds of 40 steps, 120 in all: the final round (2) is re-split at its start, evenly here.
    plans = {r: RoundPlan(r, 40, 120) for r in ("a", "b")}
    for p in plans.values():
        p.on_figures(0, {"a": (0.0, 0.1), "b": (0.0, 0.1)}, now=42, least=5)
        assert p.mid_step(1) is None  # only the final round is split halfway
        p.on_figures(1, {"a": (4.0, 0.1), "b": (4.0, 0.1)}, now=82, least=5)
        assert p.splits[2] == {"a": 40, "b": 40} and p.mid_step(2) == 100
    # Halfway (20 steps in, both at t = 10 s) b has slowed to 0.3 s a step: the 40 steps left
    # are split so both end at t = 13 s, a 30 more and b 10; the round's total stays 80.
    mid = {"a": (10.0, 20, 0.1), "b": (10.0, 20, 0.3)}
    plans["a"].on_mid_figures(2, mid, now=102, least=5)
    plans["b"].on_mid_figures(2, mid, now=101, least=5)
    assert plans["a"].splits[2] == plans["b"].splits[2] == {"a": 50, "b": 30}
    assert (plans["a"].end(2), plans["b"].end(2)) == (130, 110) and plans["a"].local_steps() == 130
    # 40 steps left over both (>= 2 x least 5 each): split again halfway through what is left.
    assert (plans["a"].mid_step(2, least=5), plans["b"].mid_step(2, least=5)) == (115, 105)
    # There (a 35 steps in, b 25, both at t = 12.5 s), b has sped up to 0.1 s a step: the 20
    # left are split evenly so both end together; the round's total stays 80.
    again = {"a": (12.5, 35, 0.1), "b": (12.5, 25, 0.1)}
    for p in plans.values():
        p.on_mid_figures(2, again, now=p.mid_step(2, least=5), least=5)
    assert plans["a"].splits[2] == plans["b"].splits[2] == {"a": 45, "b": 35}
    # 20 left over both, under 2 x 11 each: no third split (the same rule everywhere).
    assert plans["a"].mid_step(2, least=11) is None and plans["b"].mid_step(2, least=11) is None
    assert plans["a"].mid_step(2, least=5) == 120  # at 2 x 5 each: once more
    plans["a"].on_mid_figures(2, {"a": (10.0, 20, 0.3), "b": (10.0, 20, 0.1)}, now=121)
    assert plans["a"].end(2) == 125  # figures from before the last split's end the splits
    assert plans["a"].mid_step(2, least=1) is None and 2 in plans["a"].midsplit

    # one already past its new end ends where it is
    def started(me: str) -> RoundPlan:  # the final round re-split evenly at its start
        even = {2: {"a": 40, "b": 40}}
        return RoundPlan(me, 40, 120, ends={0: 40, 1: 80, 2: 120}, splits=even, resplit={2})

    late = started("b")
    late.on_mid_figures(2, mid, now=112, least=5)
    assert late.end(2) == 112
    # a region's figures missing (or unusable): every region keeps the start's split
    for bad in ({"a": (10.0, 20, 0.1)}, mid | {"b": (float("nan"), 20, 0.3)}, mid | {"b": (10.0, 41, 0.3)}):
        kept = started("a")
        kept.on_mid_figures(2, bad, now=101)
        assert kept.end(2) == 120 and kept.splits[2] == {"a": 40, "b": 40} and kept.mid_step(2) is None
    state = RoundPlan("a", 40, 120)
    state.load_state_dict(plans["a"].state_dict())
    assert state.midsplit == {2} and state.mid_step(2) is None
    assert (state.mid_count, state.mid_from) == (plans["a"].mid_count, plans["a"].mid_from)
    assert state.mid_done == plans["a"].mid_done == {2: {"a": 35, "b": 25}}
    # at most MAX_MID_SPLITS splits, however long the round
    long = {r: RoundPlan(r, 400, 1200, ends={0: 400, 1: 800, 2: 1200}, splits={2: {"a": 400, "b": 400}},
                         resplit={2}) for r in ("a", "b")}  # fmt: skip
    for k in range(MAX_MID_SPLITS):
        at = long["a"].mid_step(2, least=1)
        assert at is not None
        done = at - 800
        for p in long.values():
            p.on_mid_figures(2, {"a": (float(k), done, 0.1), "b": (float(k), done, 0.1)}, now=at)
    assert long["a"].mid_step(2, least=1) is None and long["a"].end(2) == 1200


def test_every_region_sends_its_final_rounds_figures_or_none() -> None:
    # Its peers wait for a region's figures, so whether to send is decided on the split every
    # region holds: b's 3 steps of the final round leave nothing to move, and no region sends;
    # with 4, every region sends, at the step its own share puts halfway.
    def plan(me: str, split: dict[str, int]) -> RoundPlan:
        ends = {0: 40, 1: 80, 2: 80 + split[me]}
        return RoundPlan(me, 40, 120, ends=ends, splits={2: split}, resplit={2})

    short = {"a": 77, "b": 3}
    assert plan("a", short).mid_step(2) is None and plan("b", short).mid_step(2) is None
    four = {"a": 76, "b": 4}
    assert (plan("a", four).mid_step(2), plan("b", four).mid_step(2)) == (118, 82)
    # after a split, the steps each region has left by the figures every region received: b,
    # 2 s behind a, keeps 1 or 2 of the 23 left, so neither sends again
    for me in ("a", "b"):
        p = plan(me, {"a": 40, "b": 40})
        p.on_mid_figures(2, {"a": (1.0, 20, 0.1), "b": (3.0, 37, 0.1)}, now=p.mid_step(2), least=1)
        assert p.mid_done[2] == {"a": 20, "b": 37} and p.splits[2]["b"] - 37 < 4, p.splits
        assert p.mid_step(2, least=1) is None


def test_plan_survives_a_checkpoint_and_rebases_after_a_catch_up() -> None:
    p = RoundPlan("a", 10, 50)
    p.on_figures(0, {"a": (1.0, 0.1), "b": (1.5, 0.2)})
    q = RoundPlan("a", 10, 50)
    q.load_state_dict(p.state_dict())
    assert (q.ends, q.splits) == (p.ends, p.splits) and 2 in q.splits
    # took a peer's state at round 3, at local step 7: fixed rounds from there, job axis from 30
    q.rebase(3, 7)
    assert q.ends == {3: 17, 4: 27} and q.local_steps() == 27
    assert q.job_step(7) == 30 and q.job_step(17) == 40 and q.job_step(27) == 50
    q.rebase(5, 9)  # past the last round: nothing left to run
    assert q.local_steps() == 9


def test_a_region_at_its_end_waits_for_the_final_rounds_split_rather_than_end_alone(tmp_path: Path) -> None:
    # Two regions in threads over real gRPC; a (fast) stalls 1.5 s just before it sends its
    # figures for the final round's first split (a preempted host). b sends its own on time and
    # reaches its end of the round before a's come: ending there while a splits from both
    # figures would leave the regions on different splits and the job short of its tokens. b
    # waits for a's figures at that end, so both split alike and the total stays 2 x steps.
    steps, overlap_steps = 80, 2
    cfg = SyncConfig(
        peers={"a": "", "b": ""}, rendezvous_dir=str(tmp_path), timeout_s=10, startup_timeout_s=30,
        mode="diloco", every=20, overlap=True, overlap_steps=overlap_steps, balance=True,
    )  # fmt: skip
    engines = {r: create_engine(cfg, region=r, total_steps=steps, theta0=torch.zeros(3)) for r in "ab"}
    pace = {"a": 0.005, "b": 0.015}
    least = 2 * overlap_steps + 1  # the fewest steps a split leaves a region past its figures
    trained: dict[str, int] = {}
    stalled: list[int] = []
    errors: dict[str, BaseException] = {}

    def loop(r: str) -> None:
        eng, x, step = engines[r], torch.zeros(3), 0
        plan = eng.plan
        assert plan is not None
        try:
            while step < eng.local_steps(steps):
                step += 1
                x -= 0.1 * (x - float(ord(r)))
                time.sleep(pace[r])
                rnd = eng.strategy.progress()[0]
                if r == "a" and not stalled and plan.is_final(rnd) and plan.mid_step(rnd, least) == step:
                    stalled.append(step)
                    time.sleep(1.5)
                if eng.should_sync(step):
                    eng.after_step(step, [x])
            trained[r] = step
        except Exception as e:  # noqa: BLE001 - what the region's loop raised is the outcome
            errors[r] = e
        finally:
            eng.close()

    threads = [threading.Thread(target=loop, args=(r,)) for r in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and stalled, (errors, stalled)
    finals = {r: e.plan.splits[e.plan.rounds - 1] for r, e in engines.items() if e.plan}
    assert finals["a"] == finals["b"], finals
    assert sum(trained.values()) == 2 * steps, (trained, finals)
    assert {r: e.totals()["local_steps"] for r, e in engines.items()} == trained


SLOW_S = 0.03


@pytest.mark.slow
def test_a_slowed_region_reaches_every_round_end_with_the_other(tmp_path: Path) -> None:
    # Region b sleeps 30 ms a step (a slower accelerator); balanced DiLoCo gives it fewer steps per
    # round so both regions reach each round's end together, and the job's total stays 2 x steps.
    steps, every = 120, 10
    base = {
        "job_id": "balance",
        "model": {"n_layers": 1, "d_model": 16, "n_heads": 2, "vocab": 16, "seq_len": 16},
        "data": {"kind": "synthetic-markov", "seed": 1},
        "training": {"steps": steps, "local_batch": 4, "lr": 3e-3, "warmup": 5, "seed": 7},
    }
    sync = {"mode": "diloco", "every": every, "overlap": True, "balance": True}
    cfgs = region_configs(base, ["a", "b"], sync, tmp_path)
    env = {"a": {}, "b": {"CPN_TEST_STEP_SLEEP_S": str(SLOW_S)}}
    procs = {
        r: start_region(c, tmp_path, module="tests.training.paced_worker", env_extra=env[r])
        for r, c in cfgs.items()
    }
    try:
        for p in procs.values():
            p.wait(300)
    finally:
        for p in procs.values():
            p.kill()
    results = {r: p.result() for r, p in procs.items()}
    for r, res in results.items():
        assert res is not None, procs[r].output()[-3000:]
    assert results["a"]["steps"] + results["b"]["steps"] == 2 * steps  # the job's tokens
    assert results["a"]["steps"] > 2 * results["b"]["steps"]
    reached: dict[str, dict[int, float]] = {}
    for r, p in procs.items():
        ms = p.metrics()
        reached[r] = {}
        for prev, m in zip(ms, ms[1:], strict=False):
            if m["rounds_opened"] > prev["rounds_opened"]:  # m's step ended round rounds_opened - 1
                reached[r][prev["rounds_opened"]] = m["t_end"] - m["sync_s"]
    rounds = steps // every
    assert sorted(reached["a"]) == sorted(reached["b"]) == list(range(rounds))
    # From round 3 on (round 2 is the first balanced one) the regions reach each end within a
    # few of b's steps of each other; with fixed H, b would fall behind by every x 30 ms a round.
    # "A few steps" in b's steps as this host ran them: under CPU contention a step takes longer
    # than its 30 ms sleep, and a fixed-H skew (every x 30 ms more each round) stays far above.
    ends_b = [m["t_end"] for m in procs["b"].metrics()]
    b_step = statistics.median(t1 - t0 for t0, t1 in zip(ends_b, ends_b[1:], strict=False))
    gaps = [abs(reached["a"][k] - reached["b"][k]) for k in range(3, rounds)]
    print("gaps", gaps, "b step", b_step, "steps", results["a"]["steps"], results["b"]["steps"])
    # The median round: one round stalled by another process on this host is not the mode's
    # doing, while fixed H's skew grows every round (every x 30 ms more each: 2.1 s by the median
    # round). Judged against that skew, not a wall-clock bound (0.24 s seen on a busy host, where a
    # bound of three of b's steps held on a quiet one).
    fixed_skew = every * SLOW_S * statistics.median(range(3, rounds))
    assert statistics.median(gaps) < fixed_skew / 2, (gaps, b_step, fixed_skew)
    # No growing skew: the later half of the rounds (one stalled round, even the last, is this
    # host's doing: 1.69 s seen against a 1.65 s bound while earlier rounds ended 0.14-0.48 s apart).
    late = gaps[len(gaps) // 2 :]
    assert statistics.median(late) < every * SLOW_S * (rounds - 1) / 2, gaps
    # a's total wait is these gaps summed, so every stalled round adds to it (1.82 s seen on a quiet
    # host's full suite, against half a fixed split's 1.65 s): the medians above judge the mode,
    # and the wait's figure is the WAN benchmark's (``benchmarks/wan_job.py``: utilisation).


@pytest.mark.slow
def test_the_running_round_is_re_split_in_real_workers_and_keeps_the_jobs_tokens(tmp_path: Path) -> None:
    # a sleeps 10 ms a step, b 30 ms; results land 2 steps after opening, so each region gets at
    # least 5 steps of a 20-step round and the running round is re-split from round 0 on, alike in
    # both regions, and the job's total stays 2 x steps.
    steps, every = 160, 20
    base = {
        "job_id": "resplit",
        "model": {"n_layers": 1, "d_model": 16, "n_heads": 2, "vocab": 16, "seq_len": 16},
        "data": {"kind": "synthetic-markov", "seed": 1},
        "training": {"steps": steps, "local_batch": 4, "lr": 3e-3, "warmup": 5, "seed": 7},
    }
    sync = {"mode": "diloco", "every": every, "overlap": True, "overlap_steps": 2, "balance": True}
    cfgs = region_configs(base, ["a", "b"], sync, tmp_path)
    ck_every = 40  # the job's steps between periodic checkpoints
    for r, c in cfgs.items():
        c["checkpoint"] = {"dir": str(tmp_path / r / "ckpt"), "every": ck_every}
    env = {"a": {"CPN_TEST_STEP_SLEEP_S": "0.01"}, "b": {"CPN_TEST_STEP_SLEEP_S": str(SLOW_S)}}
    procs = {
        r: start_region(c, tmp_path, module="tests.training.paced_worker", env_extra=env[r])
        for r, c in cfgs.items()
    }
    try:
        for p in procs.values():
            p.wait(300)
    finally:
        for p in procs.values():
            p.kill()
    results = {r: p.result() for r, p in procs.items()}
    for r, res in results.items():
        assert res is not None, procs[r].output()[-3000:]
    assert results["a"]["steps"] + results["b"]["steps"] == 2 * steps  # no region overran its share
    assert results["a"]["steps"] > 1.5 * results["b"]["steps"]
    reached: dict[str, dict[int, float]] = {}
    splits: dict[str, list[dict[str, int]]] = {}
    for r, p in procs.items():
        ms = p.metrics()
        reached[r] = {}
        for prev, m in zip(ms, ms[1:], strict=False):
            if m["rounds_opened"] > prev["rounds_opened"]:
                reached[r][prev["rounds_opened"]] = m["t_end"] - m["sync_s"]
        splits[r] = [m["sync"]["round_split"] for m in ms if "round_split" in m.get("sync", {})]
    rounds = steps // every
    assert sorted(reached["a"]) == sorted(reached["b"]) == list(range(rounds))
    every_split = splits["a"] + splits["b"]
    assert all(sum(s.values()) == 2 * every and min(s.values()) >= 5 for s in every_split), splits
    # Rounds re-split as they run (and the final round once more halfway, where both regions'
    # figures arrive in time: timing decides that one, the pure tests above pin its rule), the
    # same splits in both regions.
    assert len(splits["a"]) >= rounds - 1 and splits["a"] == splits["b"], splits
    # How close the rounds' ends come is timing, which this host's other work decides (a
    # stalled round here ended 0.47 s apart, as a fixed split would): the figure is the WAN
    # benchmark's (``benchmarks/wan_job.py``, balanced rounds: utilisation), not an assertion.
    gaps = [abs(reached["a"][k] - reached["b"][k]) for k in range(1, rounds)]
    print("gaps", gaps, results["a"]["steps"], results["b"]["steps"], splits)
    # Periodic checkpoints follow the job's progress: each region writes one as its position on
    # the job's step axis passes each multiple of ck_every (the same point of each round in both;
    # local multiples would give a 2 of them and b 1). The last step's is the run's final one.
    for r, p in procs.items():
        ms = p.metrics()
        pos = [m.get("job_step", m["step"]) for m in ms]
        saved = [i for i, m in enumerate(ms) if "checkpoint_s" in m and m["step"] < results[r]["steps"]]
        assert len(saved) == steps // ck_every - 1, (r, [pos[i] for i in saved])
        assert all(pos[i] // ck_every > pos[i - 1] // ck_every for i in saved), (r, [pos[i] for i in saved])
