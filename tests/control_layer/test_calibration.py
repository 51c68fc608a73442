"""The calibration step on its own: finished runs in, factors, history and error bands out."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.job_spec import JobSpec
from control_layer import calibration as cal
from control_layer.planner import cost_model as cm
from control_layer.planner.estimate import estimate_option, estimate_planned
from control_layer.planner.intervals import DEFAULT_BAND
from control_layer.planner.placement import Placement
from control_layer.planner.plan_types import ExchangeBasis, PlannedTask, PlanOption, SyncTopology
from control_layer.planner.snapshot import ResourceSnapshot
from control_layer.planner.staging import DataStaging, NodeStaging, StagedBlob, price_staging

AT = datetime(2026, 11, 23, tzinfo=UTC)
REGION_OF = {"a": "eu", "b": "us", "c": "ap"}


def _snap() -> ResourceSnapshot:
    def cluster(cid: str, region: str) -> dict:
        devices = [{"index": i, "model": "cpu", "memory_gb": 16, "tflops": 0.1} for i in range(2)]
        return {
            "id": cid,
            "region": region,
            "price_per_device_hour": 1.0,
            "nodes": [{"id": f"{cid}0", "devices": devices}],
        }

    return ResourceSnapshot.model_validate(
        {
            "regions": [{"name": "eu"}, {"name": "us"}, {"name": "ap"}],
            "clusters": [cluster("a", "eu"), cluster("b", "us"), cluster("c", "ap")],
            "links": [
                {"src": a, "dst": b, "bandwidth_gbps": 1, "latency_ms": 10}
                for a, b in (("eu", "us"), ("eu", "ap"), ("us", "ap"))
            ],
        }
    )


def _spec(steps: int = 20) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "t",
            "model": {"n_layers": 2, "d_model": 64, "n_heads": 2, "vocab": 256, "seq_len": 64},
            "training": {"steps": steps, "global_batch_tokens": 64 * 4},
            "sync": {"mode": "sync"},
        }
    )


def _option(calibration=None, regions: int = 1, spec: JobSpec | None = None) -> PlanOption:
    spec = spec or _spec()
    place = [("a", "a0"), ("b", "b0"), ("c", "c0")][:regions]
    tasks = [
        PlannedTask(dp_rank=i, pp_stage=0, tp_rank=0, cluster=c, node=n, device=0)
        for i, (c, n) in enumerate(place)
    ]
    est = estimate_option(
        Placement(spec, _snap(), tasks, dp=regions, tp=1, pp=1, zero=0, calibration=calibration)
    )
    return PlanOption(
        id="o",
        dp=regions,
        tp=1,
        pp=1,
        zero=0,
        replicas_per_cluster={c: 1 for c, _ in place},
        tasks=tasks,
        sync=SyncTopology(mode="sync"),
        estimates=est,
        regions=sorted(REGION_OF[c] for c, _ in place),
    )


def _run(
    option: PlanOption,
    *,
    compute_s: float,
    sync_s: float = 0.0,
    startup_s: float | None = 5.0,
    duration: float = 100.0,
    cost: float = 1.0,
    succeeded: bool = True,
    job: str = "j1",
    exchange: dict | None = None,
    launcher_s: float | None = None,
) -> cal.FinishedRun:
    steps = [
        {"compute_s": compute_s * (3 if i == 0 else 1), "sync_s": sync_s, "data_s": 0.001} for i in range(10)
    ]
    result = {"startup_s": startup_s} if startup_s is not None else {}
    if launcher_s is not None:
        result["launcher_s"] = launcher_s
    if exchange is not None:
        result["exchange_totals"] = exchange
    tasks = [
        cal.TaskRun(
            node_id=t.node,
            region=REGION_OF[t.cluster],
            device_model="cpu",
            steps=steps,
            result=result,
        )
        for t in option.tasks
    ]
    return cal.FinishedRun(job, AT, succeeded, option, tasks, duration, cost)


def test_efficiency_is_learned_from_measured_compute() -> None:
    option = _option()
    est = option.estimates.step_s.compute
    # Twice as slow as estimated at the default efficiency: the implied efficiency is half of it.
    state, changes = cal.update(cal.State(), _run(option, compute_s=2 * est))
    got = state.factors[(cal.EFFICIENCY, "cpu|fp32")]
    assert got.value == pytest.approx(cm.DEFAULT_DEVICE_EFFICIENCY / 2)
    assert got.runs == 1
    rows = {(c.kind, c.key): c for c in changes}
    assert rows[(cal.EFFICIENCY, "cpu|fp32")].old is None
    assert rows[(cal.STARTUP, "a0")].new == 5.0
    assert rows[(cal.TIME, "job")].residual == pytest.approx(
        (100.0 - option.estimates.duration_s) / option.estimates.duration_s
    )

    # Re-planned with it, the compute estimate matches what was measured.
    calibration = cal.to_calibration(state)
    again = _option(calibration)
    assert again.estimates.step_s.compute == pytest.approx(2 * est)
    assert again.estimates.basis is not None
    assert again.estimates.basis.efficiency == {"cpu|fp32": pytest.approx(cm.DEFAULT_DEVICE_EFFICIENCY / 2)}
    assert again.estimates.basis.startup_s == {"a0": 5.0}


def test_recent_runs_weigh_more() -> None:
    option = _option()
    est = option.estimates.step_s.compute
    state, _ = cal.update(cal.State(), _run(option, compute_s=2 * est, startup_s=4.0))
    # The second run was quoted with the first's efficiency (its basis) and ran 4x slower than the default.
    second = _option(cal.to_calibration(state))
    state, changes = cal.update(state, _run(second, compute_s=4 * est, startup_s=8.0, job="j2"))
    e0 = cm.DEFAULT_DEVICE_EFFICIENCY
    assert state.factors[(cal.EFFICIENCY, "cpu|fp32")].value == pytest.approx(
        e0 / 2 + cal.ALPHA * (e0 / 4 - e0 / 2)
    )
    assert state.factors[(cal.STARTUP, "a0")].value == pytest.approx(4.0 + cal.ALPHA * 4.0)
    row = next(c for c in changes if c.kind == cal.STARTUP)
    assert row.old == 4.0 and row.observed == 8.0 and row.residual == pytest.approx(1.0)


def test_the_launchers_and_the_workers_start_up_are_learned_apart() -> None:
    option = _option()
    compute = option.estimates.step_s.compute
    state, _ = cal.update(cal.State(), _run(option, compute_s=compute, startup_s=5.0, launcher_s=1.5))
    assert state.factors[(cal.LAUNCHER, "a0")].value == pytest.approx(1.5)
    assert state.factors[(cal.STARTUP, "a0")].value == pytest.approx(3.5)
    again = _option(cal.to_calibration(state))
    assert again.estimates.startup_s == pytest.approx(5.0)
    assert again.estimates.basis.launcher_s == {"a0": pytest.approx(1.5)}
    # A task that did not report the launcher's part teaches the workers' less the launcher's
    # part as priced.
    state, _ = cal.update(state, _run(again, compute_s=compute, startup_s=6.5, job="j2"))
    assert state.factors[(cal.STARTUP, "a0")].value == pytest.approx(3.5 + cal.ALPHA * (5.0 - 3.5))
    assert state.factors[(cal.LAUNCHER, "a0")].value == pytest.approx(1.5)


def _exchanged(
    option: PlanOption,
    *,
    rate: float,
    call_s: float,
    param_s: float,
    steps: int = 20,
    fixed_s: float = 0.0,
) -> dict:
    """What the leaders of a blocking exchange report when payloads move at ``rate`` bytes/s, each
    exchange costs ``fixed_s``, each call ``call_s`` and each parameter ``param_s`` (per idle core)
    beyond bytes and latency."""
    ex = option.estimates.basis.exchange
    own = fixed_s + ex.rounds * call_s + ex.params * param_s
    wait = ex.local_s + ex.bytes / rate + ex.latency_s + own * ex.share
    n = steps - 1
    return {"n": n, "wait_s": wait * n, "bytes": ex.bytes * n, "transfer_s": ex.bytes / rate * n}


def _sized(d_model: int) -> JobSpec:
    # Six sequences a step: a two- and a three-region plan both split them.
    spec = _spec()
    model = spec.model.model_copy(update={"d_model": d_model})
    training = spec.training.model_copy(update={"global_batch_tokens": 64 * 6})
    return spec.model_copy(update={"model": model, "training": training})


# What `sync` exchanges on loopback took on the reference box, per idle core: fixed per
# exchange, per call, per parameter.
FIXED_S, CALL_S, PARAM_S = 0.010, 0.003, 16e-9


def test_goodput_and_exchange_costs_are_learned_apart() -> None:
    one = _option(regions=1)
    state, _ = cal.update(cal.State(), _run(one, compute_s=one.estimates.step_s.compute, sync_s=0.5))
    exchange_kinds = (cal.GOODPUT, cal.EXCHANGE, cal.EXCHANGE_PARAM, cal.EXCHANGE_FIXED)
    assert not [k for k in state.factors if k[0] in exchange_kinds]

    two = _option(regions=2)
    ex = two.estimates.basis.exchange
    assert ex.rounds == 1 and ex.blocking and ex.bytes > 0 and ex.params == two_params()
    assert ex.param_s == cm.DEFAULT_EXCHANGE_PARAM_S and ex.fixed_s == cm.DEFAULT_EXCHANGE_FIXED_S
    assert two.estimates.basis.exchange_s == {"eu|us": cm.DEFAULT_EXCHANGE_CALL_S}
    assert two.estimates.basis.exchange_param_s == {"eu|us": cm.DEFAULT_EXCHANGE_PARAM_S}
    assert two.estimates.basis.exchange_fixed_s == {"eu|us": cm.DEFAULT_EXCHANGE_FIXED_S}
    # The link achieves half of what was priced; exchanges, calls and parameters cost what was
    # measured. Two-region exchanges make one call and three-region rings four: runs of both,
    # and of several sizes, tell the three parts apart.
    rate = ex.bytes_per_s / 2
    state = cal.State()
    runs = ((2, 64), (3, 256), (2, 128), (3, 512), (2, 512), (3, 64))  # 0.1 to 3.2 M parameters
    for i, (regions, d) in enumerate(runs):
        option = _option(cal.to_calibration(state), regions=regions, spec=_sized(d))
        totals = _exchanged(option, rate=rate, call_s=CALL_S, param_s=PARAM_S, fixed_s=FIXED_S)
        run = _run(option, compute_s=option.estimates.step_s.compute, exchange=totals, job=f"j{i}")
        state, changes = cal.update(state, run)
        kinds = {c.kind for c in changes}
        assert {cal.EXCHANGE, cal.EXCHANGE_PARAM, cal.EXCHANGE_FIXED} <= kinds
    assert state.factors[(cal.GOODPUT, "eu|us")].value == pytest.approx(cm.DEFAULT_WAN_GOODPUT / 2)
    # The prior's pull is a hundredth of one run.
    assert state.factors[(cal.EXCHANGE_FIXED, "eu|us")].value == pytest.approx(FIXED_S, rel=0.1)
    assert state.factors[(cal.EXCHANGE, "eu|us")].value == pytest.approx(CALL_S, rel=0.1)
    assert state.factors[(cal.EXCHANGE_PARAM, "eu|us")].value == pytest.approx(PARAM_S, rel=0.05)

    # Quoted again, a small and a large model's exchanges both cost what they take, on either ring.
    calibration = cal.to_calibration(state)
    assert calibration.exchange_fixed_s["eu|us"] == pytest.approx(FIXED_S, rel=0.1)
    for regions, d in ((2, 64), (2, 512), (3, 64)):
        option = _option(calibration, regions=regions, spec=_sized(d))
        got = option.estimates.basis.exchange
        totals = _exchanged(option, rate=rate, call_s=CALL_S, param_s=PARAM_S, fixed_s=FIXED_S)
        assert option.estimates.step_s.wan_sync == pytest.approx(totals["wait_s"] / totals["n"], rel=0.03)
        assert got.params == _sized(d).model.n_params


def two_params() -> int:
    return _spec().model.n_params


def test_one_shape_alone_is_fitted_but_cannot_be_split() -> None:
    option = _option(regions=2, spec=_sized(512))
    ex = option.estimates.basis.exchange
    totals = _exchanged(option, rate=ex.bytes_per_s, call_s=3 * CALL_S, param_s=2 * PARAM_S, fixed_s=FIXED_S)
    state, _ = cal.update(cal.State(), _run(option, compute_s=1.0, exchange=totals))
    e = state.factors[(cal.EXCHANGE_FIXED, "eu|us")].value
    c = state.factors[(cal.EXCHANGE, "eu|us")].value
    p = state.factors[(cal.EXCHANGE_PARAM, "eu|us")].value
    # The fit reproduces that shape's wait beyond the transfer (up to the prior's small pull) ...
    beyond = FIXED_S + 3 * CALL_S + ex.params * 2 * PARAM_S
    assert e + c + ex.params * p == pytest.approx(beyond, rel=0.05)
    # ... and splits what the defaults missed among the parts.
    assert e > cm.DEFAULT_EXCHANGE_FIXED_S and c > cm.DEFAULT_EXCHANGE_CALL_S
    assert p > cm.DEFAULT_EXCHANGE_PARAM_S


def test_an_overlapped_exchange_teaches_neither_goodput_nor_exchange_costs() -> None:
    two = _option(regions=2)
    basis = two.estimates.basis.model_copy(
        update={"exchange": two.estimates.basis.exchange.model_copy(update={"blocking": False})}
    )
    totals = _exchanged(two, rate=two.estimates.basis.exchange.bytes_per_s, call_s=1.0, param_s=PARAM_S)
    assert cal.observe_exchange(basis, [{"exchange_totals": totals}]) == ({}, None)
    goodput, sample = cal.observe_exchange(two.estimates.basis, [{"exchange_totals": totals}])
    assert set(goodput) == {(cal.GOODPUT, "eu|us")}
    assert sample is not None and sample.rounds == 1
    assert sample.seconds == pytest.approx(1.0 + two_params() * PARAM_S)


@settings(max_examples=40, deadline=None)
@given(
    mode=st.sampled_from(["sync", "gossip", "ssp", "async"]),
    slowdown=st.floats(min_value=0.05, max_value=20.0),
)
def test_only_payloads_the_steps_wait_for_teach_goodput(mode: str, slowdown: float) -> None:
    # Gossip rounds, ssp's senders and the async server's pushes move their payloads on background
    # threads while the replicas train: however fast those arrived, the link's goodput is what the
    # blocking exchanges show.
    two = _option(regions=2)
    ex = two.estimates.basis.exchange
    totals = _exchanged(two, rate=ex.bytes_per_s / slowdown, call_s=CALL_S, param_s=PARAM_S)
    beside = cm.streams_beside_steps(mode)
    assert beside == (mode != "sync")
    goodput, _ = cal.observe_exchange(two.estimates.basis, [{"exchange_totals": totals}], beside)
    if beside:
        assert goodput == {}
    else:
        want = min(max(two.estimates.basis.goodput["eu|us"] / slowdown, 1e-3), 1.5)
        assert goodput == {(cal.GOODPUT, "eu|us"): pytest.approx(want)}


def test_a_gossip_run_leaves_the_links_goodput_to_blocking_exchanges() -> None:
    two = _option(regions=2)
    ex = two.estimates.basis.exchange
    blocking = _exchanged(two, rate=ex.bytes_per_s / 2, call_s=CALL_S, param_s=PARAM_S)
    state, _ = cal.update(cal.State(), _run(two, compute_s=1.0, exchange=blocking))
    learned = state.factors[(cal.GOODPUT, "eu|us")].value
    assert learned == pytest.approx(two.estimates.basis.goodput["eu|us"] / 2)
    # The same plan run as gossip: its payloads crawl in beside the steps and teach nothing of the link.
    gossip = two.model_copy(update={"sync": SyncTopology(mode="gossip", every=10)})
    slow = _exchanged(two, rate=ex.bytes_per_s / 10, call_s=CALL_S, param_s=PARAM_S)
    state, changes = cal.update(state, _run(gossip, compute_s=1.0, exchange=slow, job="j2"))
    assert state.factors[(cal.GOODPUT, "eu|us")].value == learned
    assert not [c for c in changes if c.kind == cal.GOODPUT]


def test_a_goodput_learned_against_a_declared_link_does_not_apply_to_a_measured_one() -> None:
    calibration = cal.to_calibration(
        cal.State(
            factors={(cal.GOODPUT, "eu|us"): cal.Factor(0.2, 1), (cal.EXCHANGE, "eu|us"): cal.Factor(0.5, 1)}
        )
    )
    assert cm.link_goodput("us", "eu", calibration) == 0.2
    assert cm.link_goodput("us", "eu", calibration, measured=True) == cm.MEASURED_WAN_GOODPUT
    assert cm.exchange_call_seconds(["eu", "us"], calibration) == 0.5
    assert cm.exchange_call_seconds(["eu", "us"], None) == cm.DEFAULT_EXCHANGE_CALL_S


def test_a_failed_run_moves_no_factor_and_adds_no_error() -> None:
    option = _option()
    state, changes = cal.update(cal.State(), _run(option, compute_s=1.0, succeeded=False))
    assert state == cal.State() and changes == []


def test_old_results_without_parts_are_skipped() -> None:
    option = _option()
    run = cal.FinishedRun(
        "j", AT, True, option, [cal.TaskRun("a0", "eu", "cpu", [{"loss": 1.0}], {})], 10.0, None
    )
    state, changes = cal.update(cal.State(), run)
    assert state.factors == {}
    assert [(c.kind, c.key) for c in changes] == [(cal.TIME, "job")]
    record = cal.accuracy_record(run)
    assert record["error"]["cost"] is None
    assert record["actual"]["tasks"][0]["step_s"] == {}


def test_error_bands_become_quote_intervals() -> None:
    option = _option()
    d, c = option.estimates.duration_s, option.estimates.cost.total
    # No history: the wide default band.
    assert option.estimates.interval is not None
    assert option.estimates.interval.duration_s_low == pytest.approx(d * (1 + DEFAULT_BAND[0]))
    assert option.estimates.interval.duration_s_high == pytest.approx(d * (1 + DEFAULT_BAND[1]))
    state = cal.State()
    for i, err in enumerate([0.05, -0.02, 0.1, 0.0, 0.08]):
        run = _run(
            option,
            compute_s=option.estimates.step_s.compute,
            duration=d * (1 + err),
            cost=c * (1 + err),
            job=f"j{i}",
        )
        state, _ = cal.update(state, run)
    calibration = cal.to_calibration(state)
    assert calibration.time_error is not None and calibration.time_error.n == 5
    assert calibration.time_error.p10 == pytest.approx(cal.quantile([0.05, -0.02, 0.1, 0.0, 0.08], 0.1))
    interval = _option(calibration).estimates.interval
    assert interval is not None and interval.residuals == 5
    assert interval.duration_s_high - interval.duration_s_low < (DEFAULT_BAND[1] - DEFAULT_BAND[0]) * d / 5


def test_accuracy_record_has_both_breakdowns() -> None:
    option = _option()
    record = cal.accuracy_record(_run(option, compute_s=0.2, duration=50.0, cost=2.0))
    assert record["estimated"]["step_s"]["compute"] == option.estimates.step_s.compute
    assert record["estimated"]["cost_parts"]["total"] == option.estimates.cost.total
    assert record["actual"]["tasks"][0]["step_s"]["compute_s"] == pytest.approx(0.2)
    assert record["actual"]["tasks"][0]["startup_s"] == 5.0
    assert record["error"]["time"] == pytest.approx(50.0 / option.estimates.duration_s - 1)
    two = _option(regions=2)
    totals = _exchanged(two, rate=1e6, call_s=0.01, param_s=PARAM_S)
    record = cal.accuracy_record(_run(two, compute_s=0.2, exchange=totals))
    assert record["estimated"]["step_s"]["wan_sync"] == two.estimates.step_s.wan_sync
    assert record["actual"]["tasks"][0]["exchange_totals"] == totals


def test_quantile_matches_linear_interpolation() -> None:
    assert cal.quantile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert cal.quantile([0.0, 10.0], 0.1) == pytest.approx(1.0)
    assert cal.quantile([4.0], 0.9) == 4.0


def test_run_totals_count_every_step_and_teardown_is_learned() -> None:
    option = _option(regions=2)
    est = option.estimates.step_s
    run = _run(option, compute_s=est.compute, sync_s=0.0)
    # The stored per-step metrics are a sample that missed the sync waits; the worker's totals over
    # all 20 steps hold them (every step waited 0.5 s on average) and a 3 s teardown.
    totals = {"compute_s": 20 * est.compute, "sync_s": 10.0, "data_s": 0.02}
    tasks = [
        cal.TaskRun(
            t.node_id,
            t.region,
            t.device_model,
            t.steps,
            {"steps": 20, "parts_total_s": totals, "teardown_s": 3.0},
        )
        for t in run.tasks
    ]
    run = cal.FinishedRun(run.job_id, run.at, True, option, tasks, 100.0, 1.0)
    assert cal.run_means(tasks[0])["sync_s"] == pytest.approx(0.5)
    observed = cal.observe(run)
    # Without the exchange totals a sync wait cannot be split into bytes and calls: neither is learned.
    assert not [k for k in observed if k[0] in (cal.GOODPUT, cal.EXCHANGE)]
    assert observed[(cal.TEARDOWN, "a0")] == 3.0
    calibration = cal.to_calibration(cal.update(cal.State(), run)[0])
    assert calibration.teardown_s == {"a0": 3.0, "b0": 3.0}
    again = _option(calibration, regions=2)
    assert again.estimates.teardown_s == 3.0


def _profiled_option(calibration=None) -> PlanOption:
    """One node that measured a reference step (its checkpoint write by the bytes), checkpointing
    every 10 of 20 steps, with the runtime settings the planner gives it."""
    snap = _snap().model_dump()
    rate = {"tflops": 0.05, "checkpoint_s_per_mparam": 0.2}
    snap["clusters"][0]["nodes"][0]["profile"] = {"startup_s": 5.0, "rates": {"fp32": rate}}
    spec = _spec()
    spec = spec.model_copy(update={"training": spec.training.model_copy(update={"checkpoint_every": 10})})
    tasks = [PlannedTask(dp_rank=0, pp_stage=0, tp_rank=0, cluster="a", node="a0", device=0)]
    est, runtime = estimate_planned(
        Placement(
            spec,
            ResourceSnapshot.model_validate(snap),
            tasks,
            dp=1,
            tp=1,
            pp=1,
            zero=0,
            calibration=calibration,
        )
    )
    return PlanOption(
        id="c",
        dp=1,
        tp=1,
        pp=1,
        zero=0,
        replicas_per_cluster={"a": 1},
        tasks=tasks,
        sync=SyncTopology(mode="sync"),
        estimates=est,
        regions=["eu"],
        runtime=runtime,
    )


def test_a_checkpoint_write_has_a_fixed_part_learned_per_node() -> None:
    option = _profiled_option()
    est, rt = option.estimates, option.runtime
    assert rt is not None and rt.checkpoint_every is not None
    writes = cm.checkpoint_writes(est.steps, rt.checkpoint_every)
    share = est.basis.host_share["a0"]
    by_bytes = 0.2 * _spec().model.n_params / 1e6
    assert est.step_s.checkpoint * est.steps == pytest.approx(
        writes * (by_bytes + cm.DEFAULT_CHECKPOINT_FIXED_S * share)
    )
    # Each write took its bytes' seconds and 0.4 s per idle core besides (a small model's write is
    # mostly files opened and synced): the node's fixed part is learned, and quoted again each
    # write is priced at it.
    spent = writes * (by_bytes + 0.4 * share)
    result = {"steps": est.steps, "parts_total_s": {"checkpoint_s": spent, "compute_s": 1.0, "wall_s": 2.0}}
    run = cal.FinishedRun("c", AT, True, option, [cal.TaskRun("a0", "eu", "cpu", [], result)], 10.0, 1.0)
    state, _ = cal.update(cal.State(), run)
    assert state.factors[(cal.CHECKPOINT_FIXED, "a0")].value == pytest.approx(0.4)
    again = _profiled_option(cal.to_calibration(state))
    assert again.estimates.step_s.checkpoint * est.steps == pytest.approx(spent)


def _gossip(every: int = 5) -> JobSpec:
    spec = _spec()
    return spec.model_copy(update={"sync": spec.sync.model_copy(update={"mode": "gossip", "every": every})})


def _blocking_exchange_s(ex: ExchangeBasis) -> float:
    """What a blocking exchange was priced at: transfer, latency, and its own costs at the share."""
    return (
        ex.local_s
        + ex.bytes / ex.bytes_per_s
        + ex.latency_s
        + (ex.fixed_s + ex.rounds * ex.call_s + ex.params * ex.param_s) * ex.share
    )


OVERLAPPED = "eu|us" + cm.OVERLAPPED_SUFFIX  # where overlapped rounds' drift is kept


def _priced_lag(state: cal.State, round_s: float, share: float, pair: str = "eu|us") -> float:
    """The lag per round the state's drift factors price for a round of ``round_s`` local seconds."""
    drift = state.factors[(cal.EXCHANGE_DRIFT, pair)].value
    fixed = state.factors[(cal.EXCHANGE_DRIFT_FIXED, pair)].value
    return drift * round_s + fixed * max(1.0, share)


def _gossip_run(option: PlanOption, local_step: float, lag: float, job_id: str = "g") -> cal.FinishedRun:
    """A blocking gossip run of 20 steps whose every exchange cost what was priced plus ``lag``."""
    ex = option.estimates.basis.exchange
    wait = _blocking_exchange_s(ex) + lag
    n, steps = 4, 20
    totals = {"n": n, "wait_s": wait * n, "bytes": ex.bytes * n, "transfer_s": ex.bytes / ex.bytes_per_s * n}
    result = {
        "exchange_totals": totals,
        "steps": steps,
        "parts_total_s": {"wall_s": local_step * steps + wait * n, "sync_s": wait * n, "compute_s": 1.0},
    }
    tasks = [
        cal.TaskRun(node_id=t.node, region=REGION_OF[t.cluster], device_model="cpu", steps=[], result=result)
        for t in option.tasks
    ]
    return cal.FinishedRun(job_id, AT, True, option, tasks, 100.0, 1.0)


def test_the_drift_has_a_fixed_part_per_round_that_does_not_scale_with_the_round() -> None:
    # The lag per round is 0.05 s per idle core whatever the round, plus a tenth of its local
    # steps: learned on a small model's short rounds and a larger one's, it prices a round longer
    # than either (a fraction of the round alone would overprice it: 0.3 s and 0.25 s over 0.25 s
    # and 2 s of steps imply 1.2 and 0.125).
    option = _option(regions=2, spec=_gossip())
    share = option.estimates.basis.exchange.share

    def lag(local_step: float) -> float:
        return 0.1 * 5 * local_step + 0.05 * max(1.0, share)

    state = cal.State()
    for i, local_step in enumerate((0.05, 0.4, 0.05, 0.4)):
        state, _ = cal.update(state, _gossip_run(option, local_step, lag(local_step), f"g{i}"))
    assert _priced_lag(state, 5 * 1.6, share) == pytest.approx(lag(1.6), rel=0.05)
    assert state.factors[(cal.EXCHANGE_DRIFT, "eu|us")].value == pytest.approx(0.1, rel=0.05)
    assert state.factors[(cal.EXCHANGE_DRIFT_FIXED, "eu|us")].value == pytest.approx(0.05, rel=0.1)
    # Quoted again, the fixed part is priced at the option's share, the rest over its own steps.
    again = _option(cal.to_calibration(state), regions=2, spec=_gossip())
    ex = again.estimates.basis.exchange
    assert ex.drift_fixed_s == pytest.approx(state.factors[(cal.EXCHANGE_DRIFT_FIXED, "eu|us")].value)
    t_local = again.estimates.step_s.total - again.estimates.step_s.wan_sync
    per_step = option.estimates.step_s.wan_sync + _priced_lag(state, 5 * t_local, ex.share) / 5
    assert again.estimates.step_s.wan_sync == pytest.approx(per_step)


def test_regions_that_exchange_every_h_steps_teach_their_drift_not_the_exchange_costs() -> None:
    option = _option(regions=2, spec=_gossip())
    ex = option.estimates.basis.exchange
    assert ex.every == 5 and ex.blocking and ex.drift == 0.0
    # Each exchange costs what was priced, plus the first region waiting a fifth of the 5 local
    # steps (0.2 s each) for the last: 0.2 s.
    local_step, drift = 0.2, 0.2
    priced = _blocking_exchange_s(ex)
    wait = priced + drift * 5 * local_step
    n = 4
    totals = {"n": n, "wait_s": wait * n, "bytes": ex.bytes * n, "transfer_s": ex.bytes / ex.bytes_per_s * n}
    steps = 20
    result = {
        "exchange_totals": totals,
        "steps": steps,
        "parts_total_s": {"wall_s": local_step * steps + wait * n, "sync_s": wait * n, "compute_s": 1.0},
    }
    tasks = [
        cal.TaskRun(
            node_id=t.node,
            region=REGION_OF[t.cluster],
            device_model="cpu",
            steps=[],
            result=result,
        )
        for t in option.tasks
    ]
    state, _ = cal.update(cal.State(), cal.FinishedRun("g", AT, True, option, tasks, 100.0, 1.0))
    # One round length: the lag it showed is priced back at that length (split between the
    # fraction of the round and the fixed part until rounds of other lengths tell them apart).
    assert _priced_lag(state, 5 * local_step, ex.share) == pytest.approx(
        drift * 5 * local_step,
        rel=0.01,  # the ridge's pull
    )
    # The exchange's own costs are learned from lockstep exchanges.
    assert not {(k, "eu|us") for k in (cal.EXCHANGE, cal.EXCHANGE_FIXED)} & set(state.factors)
    # Quoted again, each exchange adds the lag over the option's own local steps.
    again = _option(cal.to_calibration(state), regions=2, spec=_gossip())
    assert again.estimates.basis.exchange.drift == pytest.approx(
        state.factors[(cal.EXCHANGE_DRIFT, "eu|us")].value
    )
    t_local = again.estimates.step_s.total - again.estimates.step_s.wan_sync
    per_step = option.estimates.step_s.wan_sync + _priced_lag(state, 5 * t_local, ex.share) / 5
    assert again.estimates.step_s.wan_sync == pytest.approx(per_step)
    # A lockstep mode never pays it.
    assert _option(cal.to_calibration(state), regions=2).estimates.basis.exchange.drift == 0.0


def test_gossip_regions_that_count_different_exchanges_teach_the_same_drift() -> None:
    # In gossip one region may count more exchanges than another (it pulls more often than it is
    # pulled); the lag it waited for is its total wait over the run's rounds, not per exchange.
    option = _option(regions=2, spec=_gossip())
    ex = option.estimates.basis.exchange
    local_step, drift, steps = 0.2, 0.2, 20
    priced = _blocking_exchange_s(ex)
    per_round = priced + drift * 5 * local_step
    rounds = steps // 5

    def task(t: PlannedTask, n: int) -> cal.TaskRun:
        wait = per_round * rounds  # the same lag, counted over n exchanges
        totals = {"n": n, "wait_s": wait, "bytes": ex.bytes * n, "transfer_s": ex.bytes / ex.bytes_per_s * n}
        result = {
            "exchange_totals": totals,
            "steps": steps,
            "parts_total_s": {"wall_s": local_step * steps + wait, "sync_s": wait, "compute_s": 1.0},
        }
        return cal.TaskRun(
            node_id=t.node, region=REGION_OF[t.cluster], device_model="cpu", steps=[], result=result
        )

    tasks = [task(t, n) for t, n in zip(option.tasks, (2, 5), strict=True)]
    state, _ = cal.update(cal.State(), cal.FinishedRun("g2", AT, True, option, tasks, 100.0, 1.0))
    assert _priced_lag(state, 5 * local_step, ex.share) == pytest.approx(
        drift * 5 * local_step,
        rel=0.01,  # the ridge's pull
    )


def _overlapped_diloco(calibration=None) -> PlanOption:
    """Two regions, DiLoCo every 5 steps with the runtime settings the planner gives it (overlap)."""
    spec = _spec()
    spec = spec.model_copy(update={"sync": spec.sync.model_copy(update={"mode": "diloco", "every": 5})})
    tasks = [
        PlannedTask(dp_rank=i, pp_stage=0, tp_rank=0, cluster=c, node=n, device=0)
        for i, (c, n) in enumerate([("a", "a0"), ("b", "b0")])
    ]
    est, runtime = estimate_planned(
        Placement(spec, _snap(), tasks, dp=2, tp=1, pp=1, zero=0, calibration=calibration)
    )
    return PlanOption(
        id="d",
        dp=2,
        tp=1,
        pp=1,
        zero=0,
        replicas_per_cluster={"a": 1, "b": 1},
        tasks=tasks,
        sync=SyncTopology(mode="diloco"),
        estimates=est,
        regions=["eu", "us"],
        runtime=runtime,
    )


def test_an_overlapped_run_teaches_the_drift_its_rounds_could_not_hide() -> None:
    option = _overlapped_diloco()
    ex, rt = option.estimates.basis.exchange, option.runtime
    assert rt is not None and rt.overlap and rt.overlap_steps >= 1
    assert not ex.blocking and ex.every == 5 and ex.drift == 0.0
    # What the runtime waits for: the last, blocking round at its own cost, the part of the three
    # overlapped rounds that does not hide behind the delay, and in each of the 4 rounds the last
    # region's lag, a quarter of the 5 local steps of 0.2 s.
    local_step, drift, steps = 0.2, 0.25, 20
    cpu = (ex.fixed_s + ex.params * ex.param_s) * ex.share
    own = ex.local_s + ex.bytes / ex.bytes_per_s + ex.latency_s + cpu + ex.rounds * ex.call_s * ex.share
    beside = own + cpu if ex.share > 1 else own
    exposed = max(0.0, beside - rt.overlap_steps * local_step)
    typical = own + 3 * exposed + drift * 4 * 5 * local_step

    def task(node: str, region: str, wait: float) -> cal.TaskRun:
        totals = {"n": 7, "wait_s": wait, "bytes": ex.bytes * 7, "transfer_s": 0.01}
        # Compute as estimated: the efficiency stays, so the local step quoted again does too.
        compute = option.estimates.step_s.compute * steps
        parts = {"wall_s": local_step * steps + wait, "sync_s": wait, "compute_s": compute}
        result = {"exchange_totals": totals, "steps": steps, "parts_total_s": parts}
        return cal.TaskRun(node, region, "cpu", [], result)

    # The median region's total wait is what counts: here a third, slowest region waited least.
    tasks = [task("a0", "eu", typical), task("b0", "us", typical + 0.3), task("c0", "ap", own)]
    run = cal.FinishedRun("d", AT, True, option, tasks, 100.0, 1.0)
    state, _ = cal.update(cal.State(), run)
    assert _priced_lag(state, 5 * local_step, ex.share, OVERLAPPED) == pytest.approx(
        drift * 5 * local_step,
        rel=0.01,  # the ridge's pull
    )
    # Nothing else about the exchange is learned from an overlapped run, nor the blocking rounds' drift.
    learned = {(k, "eu|us") for k in (cal.EXCHANGE, cal.EXCHANGE_FIXED, cal.GOODPUT, cal.EXCHANGE_DRIFT)}
    assert not learned & set(state.factors)

    # Quoted again, every round adds the drift over the option's own local steps, overlapped or
    # not; the final round's exchange is priced as before.
    again = _overlapped_diloco(cal.to_calibration(state))
    est, was = again.estimates, option.estimates
    assert est.basis.exchange.drift == pytest.approx(state.factors[(cal.EXCHANGE_DRIFT, OVERLAPPED)].value)
    assert est.basis.exchange_drift[OVERLAPPED] == est.basis.exchange.drift
    t_local = est.step_s.total - est.step_s.wan_sync
    rounds = 4
    per_step = (
        was.step_s.wan_sync
        + _priced_lag(state, 5 * t_local, est.basis.exchange.share, OVERLAPPED) * rounds / steps
    )
    assert est.step_s.wan_sync == pytest.approx(per_step)
    assert est.final_sync_s == pytest.approx(was.final_sync_s)
    assert est.duration_s > was.duration_s


def test_an_overlapped_run_that_waited_only_for_its_exchanges_shows_no_drift() -> None:
    option = _overlapped_diloco()
    ex = option.estimates.basis.exchange
    own = (
        ex.local_s
        + ex.bytes / ex.bytes_per_s
        + ex.latency_s
        + (ex.fixed_s + ex.rounds * ex.call_s + ex.params * ex.param_s) * ex.share
    )
    result = {
        "exchange_totals": {"n": 7, "wait_s": own, "bytes": 0, "transfer_s": 0.0},
        "steps": 20,
        "parts_total_s": {"wall_s": 0.2 * 20 + own, "sync_s": own, "compute_s": 1.0},
    }
    tasks = [cal.TaskRun(n, r, "cpu", [], result) for n, r in (("a0", "eu"), ("b0", "us"))]
    observed = cal.observe(cal.FinishedRun("d", AT, True, option, tasks, 100.0, 1.0))
    assert observed[(cal.EXCHANGE_DRIFT, OVERLAPPED)] == pytest.approx(0.0, abs=1e-9)


def _overlapped_run(option: PlanOption, local_step: float, lag: float) -> cal.FinishedRun:
    """Two regions of an overlapped DiLoCo option, 20 steps, whose rounds hid their exchanges but
    for what was priced to show, and whose median region waited ``lag`` more each round."""
    ex, rt = option.estimates.basis.exchange, option.runtime
    assert rt is not None and rt.overlap_steps is not None
    cpu = (ex.fixed_s + ex.params * ex.param_s) * ex.share
    own = ex.local_s + ex.bytes / ex.bytes_per_s + ex.latency_s + cpu + ex.rounds * ex.call_s * ex.share
    beside = own + cpu if ex.share > 1 else own
    steps, rounds = 20, 4
    wait = own + (rounds - 1) * max(0.0, beside - rt.overlap_steps * local_step) + rounds * lag
    compute = option.estimates.step_s.compute * steps
    parts = {"wall_s": local_step * steps + wait, "sync_s": wait, "compute_s": compute}
    totals = {"n": 7, "wait_s": wait, "bytes": 0, "transfer_s": 0.0}
    result = {"exchange_totals": totals, "steps": steps, "parts_total_s": parts}
    tasks = [cal.TaskRun(n, r, "cpu", [], result) for n, r in (("a0", "eu"), ("b0", "us"))]
    return cal.FinishedRun("d", AT, True, option, tasks, 100.0, 1.0)


def test_overlapped_and_blocking_rounds_learn_their_drift_apart() -> None:
    # On a host with no idle core an overlapped round's exchange lands late behind the training
    # beside it: its regions waited a third of their rounds, where blocking gossip rounds on the
    # same pair waited a twentieth. One fit over both priced each at a mix of the two.
    gossip, diloco = _option(regions=2, spec=_gossip()), _overlapped_diloco()
    local_step = 0.2
    state = cal.State()
    for i in range(2):
        state, _ = cal.update(state, _gossip_run(gossip, local_step, 0.05 * 5 * local_step, f"g{i}"))
        state, _ = cal.update(state, _overlapped_run(diloco, local_step, 0.3 * 5 * local_step))
    calibration = cal.to_calibration(state)
    for option, fraction in ((gossip, 0.05), (diloco, 0.3)):
        ex = option.estimates.basis.exchange
        pair = OVERLAPPED if not ex.blocking else "eu|us"
        assert _priced_lag(state, 5 * local_step, ex.share, pair) == pytest.approx(
            fraction * 5 * local_step, rel=0.02
        )
    # Quoted again, each option's rounds are priced at the lag of rounds like its own.
    again_gossip = _option(calibration, regions=2, spec=_gossip()).estimates.basis.exchange
    again_diloco = _overlapped_diloco(calibration).estimates.basis.exchange
    assert again_gossip.drift == state.factors[(cal.EXCHANGE_DRIFT, "eu|us")].value
    assert again_diloco.drift == state.factors[(cal.EXCHANGE_DRIFT, OVERLAPPED)].value
    assert again_diloco.drift > 3 * again_gossip.drift


def test_concurrent_stage_rings_teach_no_goodput_and_their_wait_is_read_against_the_priced_transfer() -> None:
    # Per-stage rings share links in ways the leaders cannot see: a payload at half the link's rate
    # may be one of two rings through it, not a slow link.
    two = _option(regions=2)
    ex = two.estimates.basis.exchange.model_copy(update={"rings": 2})
    basis = two.estimates.basis.model_copy(update={"exchange": ex})
    totals = _exchanged(two, rate=ex.bytes_per_s / 2, call_s=CALL_S, param_s=PARAM_S)
    goodput, sample = cal.observe_exchange(basis, [{"exchange_totals": totals}])
    assert goodput == {}
    wait = totals["wait_s"] / totals["n"]
    assert sample is not None
    assert sample.seconds == pytest.approx(wait - ex.local_s - ex.bytes / ex.bytes_per_s - ex.latency_s)


def test_a_hierarchical_exchange_teaches_no_goodput_and_its_gathers_are_read_as_priced() -> None:
    # Its payloads cross the regions' own hops (members to heads and back) as well as the WAN.
    two = _option(regions=2)
    ex = two.estimates.basis.exchange.model_copy(update={"hierarchical": True, "local_s": 0.05})
    basis = two.estimates.basis.model_copy(update={"exchange": ex})
    totals = _exchanged(two, rate=ex.bytes_per_s / 2, call_s=CALL_S, param_s=PARAM_S)
    goodput, sample = cal.observe_exchange(basis, [{"exchange_totals": totals}])
    assert goodput == {}
    wait = totals["wait_s"] / totals["n"]
    assert sample is not None
    assert sample.seconds == pytest.approx(wait - ex.local_s - ex.bytes / ex.bytes_per_s - ex.latency_s)


def test_staging_figures_are_learned_per_node_from_what_dominated_each_item() -> None:
    node = "a0"
    # Priced at 0.1 s per fetch and 4 MB/s: a 2 MB item is mostly bytes, a 4 kB one mostly fixed.
    probe = NodeStaging(fetch_fixed_s=0.1, bytes_per_s=4e6, venv_s=1.0)
    staging = DataStaging(code=StagedBlob(bytes=4_000), nodes={node: probe})
    option = price_staging(_option(), _spec(), _snap(), staging)
    (read,) = option.estimates.staging.reads
    staged = [
        {"kind": "code", "bytes": 4_000, "seconds": 0.301, "source": "http"},  # fixed 0.3 s
        {"kind": "data", "bytes": 8_000_000, "seconds": 4.1, "source": "http"},  # 2 MB/s
        {"kind": "data", "bytes": 400_000, "seconds": 0.3, "source": "http"},  # half each: neither
        {"kind": "data", "bytes": 9_000_000_000, "seconds": 0.01, "cache_hit": True, "source": "cache"},
        {"kind": "data", "bytes": 5_000_000, "seconds": 0.05, "source": "file"},  # read in place
        {"kind": "venv", "seconds": 6.0, "cpu_s": 2.5, "cache_hit": False},
    ]
    got = cal.observe_staging({"staging": {"items": staged, "seconds": 11.0}}, read)
    assert got == {
        cal.STAGING_FIXED: [pytest.approx(0.3)],
        cal.STAGING: [pytest.approx(2e6)],
        cal.VENV: [pytest.approx(6.0 / read.share)],  # its wall over the share priced, as a start-up
    }
    assert cal.observe_staging({"staging": [{"bytes": 5, "seconds": 0}]}, read) == {}
    # Unpriced staging: an item's bytes over its seconds, as before there were fixed parts.
    assert cal.observe_staging({"staging": staged[1:2]}) == {cal.STAGING: [pytest.approx(8e6 / 4.1)]}
    run = cal.FinishedRun(
        "s", AT, True, option, [cal.TaskRun(node, "eu", "cpu", [], {"staging": {"items": staged}})], 10.0, 1.0
    )
    state, changes = cal.update(cal.State(), run)
    learned = cal.to_calibration(state)
    assert learned.staging_bytes_per_s == {node: pytest.approx(2e6)}
    assert learned.staging_fixed_s == {node: pytest.approx(0.3)}
    assert learned.venv_s == {node: pytest.approx(6.0 / read.share)}
    # Unpriced staging: a venv teaches its CPU seconds.
    assert cal.observe_staging({"staging": staged[-1:]}) == {cal.VENV: [2.5]}
    kinds = {(c.kind, c.key) for c in changes}
    assert {(cal.STAGING, node), (cal.STAGING_FIXED, node), (cal.VENV, node)} <= kinds
    # The next quote prices the node at what it learned, not at its probe.
    again = price_staging(_option(), _spec(), _snap(), staging, learned)
    (read,) = again.estimates.staging.reads
    assert (read.rate_basis, read.fixed_basis) == ("learned", "learned")
    assert again.estimates.staging_s == pytest.approx(0.3 + 4_000 / 2e6)


def test_a_scheduler_backed_nodes_queue_wait_is_learned_as_its_miss_at_each_start() -> None:
    """Its tasks measured 50 s, then 30 s more than their agent expected at submission: the node's
    correction moves toward each miss as each starts, and quotes add it to the node's report; a
    task that did not queue (no figures) teaches nothing, and the job's end does not teach the
    wait again."""
    at = datetime(2026, 1, 1, tzinfo=UTC)
    first = {"queue_wait_s": 70.0, "queue_wait_estimate_s": 20.0}
    state, changes = cal.learn_queue_wait(cal.State(), "a0", "j1", at, first)
    assert state.factors[(cal.QUEUE_WAIT, "a0")] == cal.Factor(pytest.approx(50.0), 1)
    assert [(c.kind, c.key, c.old, c.new, c.observed) for c in changes] == [
        (cal.QUEUE_WAIT, "a0", None, pytest.approx(50.0), pytest.approx(50.0))
    ]
    assert cal.to_calibration(state).queue_wait_s == {"a0": pytest.approx(50.0)}
    second = {"queue_wait_s": 40.0, "queue_wait_estimate_s": 10.0}
    state, _ = cal.learn_queue_wait(state, "a0", "j2", at, second)
    assert state.factors[(cal.QUEUE_WAIT, "a0")].value == pytest.approx(50.0 + cal.ALPHA * (30.0 - 50.0))
    assert cal.learn_queue_wait(state, "a0", "j3", at, {"startup_s": 5.0}) == (state, [])
    option = _option()
    run = _run(option, compute_s=option.estimates.step_s.compute, job="j2")
    for t in run.tasks:
        t.result.update({"queue_wait_s": 400.0, "queue_wait_estimate_s": 10.0})
    ended, _ = cal.update(state, run)
    assert ended.factors[(cal.QUEUE_WAIT, "a0")] == state.factors[(cal.QUEUE_WAIT, "a0")]
    assert cal.observe_queue_wait({"startup_s": 5.0}) is None
    assert cal.observe_queue_wait({"queue_wait_s": float("nan"), "queue_wait_estimate_s": 1.0}) is None
