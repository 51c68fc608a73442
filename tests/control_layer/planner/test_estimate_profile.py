"""estimate_option on nodes that measured a worker profile: every term by hand, shared hosts,
checkpoint writes, blocking sync and the calibrated start-up."""

from __future__ import annotations

import math

import pytest

from contracts.job_spec import JobSpec
from contracts.model import gpt_param_count, model_config, train_flops_per_token
from control_layer.planner import cost_model as cm
from control_layer.planner.estimate import estimate_option, estimate_planned
from control_layer.planner.host_shares import host_shares, others_now
from control_layer.planner.links import intra_bytes_per_s
from control_layer.planner.placement import Placement
from control_layer.planner.plan_types import Calibration, Estimates, PlannedTask, RuntimeSettings
from control_layer.planner.snapshot import ResourceSnapshot

RATE = {
    "tflops": 0.05,
    "micro_batch_s": 0.004,
    "step_s": 0.002,
    "optimizer_s_per_mparam": 0.01,
    "data_s_per_mtoken": 10.0,
    "checkpoint_s_per_mparam": 0.2,
}


def _snap(cores: int = 2, load: float = 0.0, busy: int = 0, launcher: float = 0.0) -> ResourceSnapshot:
    """Two agents on one host ("box"), two CPU slots each, in two regions."""

    def node(nid: str, startup: float) -> dict:
        return {
            "id": nid,
            "hostname": "box",
            "devices": [
                {"index": i, "model": "cpu", "memory_gb": 4, "tflops": 0.05, "free": i >= busy}
                for i in range(2)
            ],
            "profile": {
                "startup_s": startup,
                "teardown_s": 0.5,
                "physical_cores": cores,
                "host_load_factor": load,
                "launcher_s": launcher,
                "rates": {"fp32": RATE},
            },
        }

    return ResourceSnapshot.model_validate(
        {
            "regions": [{"name": "eu"}, {"name": "us"}],
            "clusters": [
                {"id": "a", "region": "eu", "price_per_device_hour": 1.0, "nodes": [node("a0", 6.0)]},
                {"id": "b", "region": "us", "price_per_device_hour": 1.0, "nodes": [node("b0", 9.0)]},
            ],
            "links": [{"src": "eu", "dst": "us", "bandwidth_gbps": 0.1, "latency_ms": 20}],
        }
    )


def _spec(steps: int = 40, **extra) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "t",
            "model": {"n_layers": 2, "d_model": 128, "n_heads": 4, "vocab": 256, "seq_len": 64},
            "training": {"steps": steps, "global_batch_tokens": 64 * 8, **extra},
            "sync": {"mode": "diloco", "every": 10},
        }
    )


def _tasks(nodes: list[tuple[str, str, int]]) -> list[PlannedTask]:
    return [
        PlannedTask(dp_rank=i, pp_stage=0, tp_rank=0, cluster=c, node=n, device=d)
        for i, (c, n, d) in enumerate(nodes)
    ]


ONE_NODE = _tasks([("a", "a0", 0), ("a", "a0", 1)])
TWO_NODES = _tasks([("a", "a0", 0), ("a", "a0", 1), ("b", "b0", 0), ("b", "b0", 1)])


def test_one_node_by_hand() -> None:
    spec = _spec()
    est = estimate_option(Placement(spec, _snap(), ONE_NODE, dp=2, tp=1, pp=1, zero=0))
    cfg = model_config(spec.model)
    # 8 sequences over 2 replicas: 4 micro-batches of one sequence each; 2 slots on 2 cores.
    t_mb = train_flops_per_token(cfg) * 64 / (RATE["tflops"] * 1e12) + RATE["micro_batch_s"]
    assert est.step_s.compute == pytest.approx(4 * t_mb + RATE["step_s"])
    assert est.step_s.data == pytest.approx(RATE["data_s_per_mtoken"] * 4 * 64 / 1e6)
    assert est.step_s.optimizer == pytest.approx(RATE["optimizer_s_per_mparam"] * gpt_param_count(cfg) / 1e6)
    assert est.step_s.checkpoint == 0.0 and est.step_s.wan_sync == 0.0
    assert (est.startup_s, est.teardown_s, est.final_sync_s) == (6.0, 0.5, 0.0)
    assert est.duration_s == pytest.approx(6.0 + 40 * est.step_s.total + 0.5)
    assert est.cost.devices == pytest.approx(2 * 1.0 * est.duration_s / 3600)
    assert est.basis is not None and est.basis.efficiency == {"cpu|fp32": 1.0}


def test_slots_beyond_the_cores_are_priced_as_shared() -> None:
    # Four slots on one two-core host: each runs at half speed; the slowest node starts last.
    spec = _spec()
    alone = estimate_option(Placement(spec, _snap(cores=4), TWO_NODES, dp=4, tp=1, pp=1, zero=0))
    shared = estimate_option(Placement(spec, _snap(cores=2), TWO_NODES, dp=4, tp=1, pp=1, zero=0))
    assert host_shares(_snap(cores=2), TWO_NODES) == {"a0": 2.0, "b0": 2.0}
    assert shared.step_s.compute == pytest.approx(2 * alone.step_s.compute)
    assert shared.step_s.data == pytest.approx(2 * alone.step_s.data)
    # The workers start and stop on the shared cores too; the slowest node starts last.
    assert (alone.startup_s, shared.startup_s) == (9.0, 18.0)
    assert shared.teardown_s == 2 * alone.teardown_s == 1.0
    # Slots busy with another job count too, and so does the load the host measured under.
    # (one slot of each node busy: 2 + the plan's 2 on 3 cores)
    assert host_shares(_snap(cores=3, busy=1), _tasks([("a", "a0", 1), ("b", "b0", 1)])) == {
        "a0": pytest.approx(4 / 3),
        "b0": pytest.approx(4 / 3),
    }
    assert host_shares(_snap(cores=8, load=1.7), ONE_NODE) == {"a0": 1.7}


def test_the_launchers_part_of_the_start_up_shares_the_host_one_process_per_node() -> None:
    # Four slots on one two-core host: the workers run at half speed, but before them each node
    # runs one launcher, two processes on two cores.
    snap = _snap(cores=2, launcher=2.0)
    assert host_shares(snap, TWO_NODES, one_per_node=True) == {"a0": 1.0, "b0": 1.0}
    est = estimate_option(Placement(_spec(), snap, TWO_NODES, dp=4, tp=1, pp=1, zero=0))
    # b0 starts last: its launcher's 2 s alone, then its workers' 9 - 2 = 7 s at half speed.
    assert est.startup_s == pytest.approx(2.0 * 1.0 + 7.0 * 2.0)
    assert est.basis is not None
    assert est.basis.launch_share == {"a0": 1.0, "b0": 1.0}
    assert est.basis.launcher_s == {"a0": 2.0, "b0": 2.0}
    # Calibrated parts replace the measured ones, each at its own share.
    cal = Calibration(launcher_s={"b0": 1.0}, startup_s={"b0": 5.0})
    again = estimate_option(Placement(_spec(), snap, TWO_NODES, dp=4, tp=1, pp=1, zero=0, calibration=cal))
    assert again.startup_s == pytest.approx(max(2.0 + 4.0 * 2.0, 1.0 + 5.0 * 2.0))
    # Without the launcher measured apart, the whole start-up is the workers' (as before).
    assert (
        estimate_option(Placement(_spec(), _snap(cores=2), TWO_NODES, dp=4, tp=1, pp=1, zero=0)).startup_s
        == 18.0
    )


def test_the_hosts_contention_from_heartbeats_counts_what_else_runs_there() -> None:
    snap = _snap(cores=2, load=3.0)
    for node in snap.clusters[0].nodes + snap.clusters[1].nodes:
        node.cpu_contention = 2.5  # a new thread gets 1/2.5 of a core: 4 others runnable on 2 cores
    # (4 + the plan's 2) on 2 cores; the contention now replaces the figure measured at registration.
    assert host_shares(snap, ONE_NODE) == {"a0": pytest.approx(3.0)}
    est = estimate_option(Placement(_spec(), snap, ONE_NODE, dp=2, tp=1, pp=1, zero=0))
    idle = estimate_option(Placement(_spec(), _snap(cores=4), ONE_NODE, dp=2, tp=1, pp=1, zero=0))
    assert est.step_s.compute == pytest.approx(3 * idle.step_s.compute)
    # The start-up the profile holds is per idle core already (the launcher's and the worker's CPU
    # time, whatever the load at registration): 6 s, three times that on this share of the host;
    # the teardown, a wall time, is divided by the load it measured under.
    assert est.startup_s == pytest.approx(6.0 * 3.0)
    assert est.teardown_s == pytest.approx(0.5 / 3.0 * 3.0)


def test_an_idle_host_counts_no_other_thread() -> None:
    def share(contention: float) -> float:
        snap = _snap(cores=2, load=3.0)
        for node in snap.clusters[0].nodes + snap.clusters[1].nodes:
            node.cpu_contention = contention
        return host_shares(snap, ONE_NODE)["a0"]

    # One runnable thread per two cores, the probe's own: the plan's 2 slots alone on 2 cores run
    # as on idle cores; one other runnable thread beside the probe's makes 3 threads on 2 cores.
    assert share(0.5) == pytest.approx(1.0)
    assert share(1.0) == pytest.approx(1.5)


def test_a_figure_taken_beside_other_jobs_prices_the_host_as_it_is_at_the_quote() -> None:
    # The benchmark's host: b0's agent sat idle beside a job of 4 slots (on nodes of this host)
    # and read 2.5; a0's agent ran that job and still holds its figure from before, 1.0, taken
    # beside another agent's start-up that the control plane knew nothing of.
    def shares(busy_now: int, b_busy_then: float | None, a_busy_then: float | None = 0.0) -> float:
        snap = _snap(cores=2, busy=busy_now)
        a, b = snap.clusters[0].nodes[0], snap.clusters[1].nodes[0]
        a.cpu_contention, a.cpu_contention_busy = 1.0, a_busy_then
        b.cpu_contention, b.cpu_contention_busy = 2.5, b_busy_then
        return host_shares(snap, ONE_NODE)["a0"]

    # That job is over: b0's figure less its 4 slots is the host alone (0 others), the quietest;
    # the plan's 2 slots on 2 cores.
    assert shares(busy_now=0, b_busy_then=4.0) == pytest.approx(1.0)
    # A job holding one slot of each node now is counted whatever the figures saw.
    assert shares(busy_now=1, b_busy_then=4.0) == pytest.approx((0 + 2 + 2) / 2)
    # No probe instants (agents that leave cpn's own threads out of the figure): each figure is
    # what cpn does not place, the quietest a0's 1.0, one other thread; the slots busy now are
    # added to it (one of each node's: 2).
    assert shares(busy_now=0, b_busy_then=None, a_busy_then=None) == pytest.approx((1 + 2) / 2)
    assert shares(busy_now=1, b_busy_then=None, a_busy_then=None) == pytest.approx((1 + 2 + 2) / 2)
    assert others_now(2.5, 2, 4.0, 0) == 0.0  # below nothing: what the figure counts
    assert others_now(2.5, 2, 1.0, 3) == pytest.approx(3.0 + 3)


def test_diloco_blocks_every_h_steps_as_configured() -> None:
    est = estimate_option(Placement(_spec(), _snap(cores=4), TWO_NODES, dp=4, tp=1, pp=1, zero=0))
    # 4 exchanges in 40 steps, each a blocking ring all-reduce of fp32 parameters over 0.1 Gbps.
    assert est.step_s.wan_sync > 0
    assert est.final_sync_s == 0.0  # a blocking exchange at the last step is already in the steps


def test_checkpoint_writes_are_priced_from_checkpoint_every() -> None:
    spec = _spec(steps=40)
    plain = estimate_option(Placement(spec, _snap(), ONE_NODE, dp=2, tp=1, pp=1, zero=0))
    assert plain.step_s.checkpoint == 0.0
    every = spec.model_copy(update={"training": spec.training.model_copy()})
    object.__setattr__(every.training, "checkpoint_every", 10)  # the JobSpec field as the jobs API sets it
    est = estimate_option(Placement(every, _snap(), ONE_NODE, dp=2, tp=1, pp=1, zero=0))
    writes = cm.checkpoint_writes(40, 10)
    assert writes == 4  # steps 10, 20, 30 and the final one
    # Each write: its bytes at the measured rate and a fixed part (files opened and synced), the
    # default until runs calibrate it per node; on a shared host the fixed part takes turns too.
    by_bytes = RATE["checkpoint_s_per_mparam"] * spec.model.n_params / 1e6
    per_write = by_bytes + cm.DEFAULT_CHECKPOINT_FIXED_S
    assert est.step_s.checkpoint * 40 == pytest.approx(writes * per_write)
    assert est.basis is not None and est.basis.checkpoint_fixed_s == {"a0": cm.DEFAULT_CHECKPOINT_FIXED_S}
    calibrated = Calibration(checkpoint_fixed_s={"a0": 0.05})
    again = estimate_option(
        Placement(every, _snap(), ONE_NODE, dp=2, tp=1, pp=1, zero=0, calibration=calibrated)
    )
    assert again.step_s.checkpoint * 40 == pytest.approx(writes * (by_bytes + 0.05))
    shared = estimate_option(
        Placement(every, _snap(cores=1), ONE_NODE, dp=2, tp=1, pp=1, zero=0, calibration=calibrated)
    )
    assert shared.step_s.checkpoint * 40 == pytest.approx(writes * (by_bytes + 0.05 * 2))


def test_calibration_replaces_the_measured_startup_and_scales_the_rate() -> None:
    spec = _spec()
    base = estimate_option(Placement(spec, _snap(), ONE_NODE, dp=2, tp=1, pp=1, zero=0))
    cal = Calibration(device_efficiency={"cpu|fp32": 0.5}, startup_s={"a0": 20.0}, teardown_s={"a0": 2.0})
    est = estimate_option(Placement(spec, _snap(), ONE_NODE, dp=2, tp=1, pp=1, zero=0, calibration=cal))
    assert est.startup_s == 20.0 and est.teardown_s == 2.0
    assert est.step_s.compute == pytest.approx(2 * base.step_s.compute)
    assert est.basis is not None and est.basis.efficiency == {"cpu|fp32": 0.5}


def _overlapped(snap: ResourceSnapshot, delay: int) -> Estimates:
    runtime = RuntimeSettings(
        checkpoint_every=40,
        checkpoint_write_s=0.0,
        checkpoint_fraction=0.0,
        overlap=True,
        overlap_steps=delay,
    )
    slow_exchange = Calibration(exchange_fixed_s={"eu|us": 0.5})  # a fixed cost no one step hides
    return estimate_option(
        Placement(_spec(), snap, TWO_NODES, dp=4, tp=1, pp=1, zero=0, calibration=slow_exchange),
        runtime=runtime,
    )


def test_an_overlapped_exchange_on_a_host_with_no_idle_core_takes_its_cpu_work_twice() -> None:
    def exposed(est: Estimates, extra: float) -> float:
        # What a round adds beyond its one step of cover (4 rounds in 40 steps); the last round,
        # blocking every region, is ``final_sync_s``: the exchange as a blocking one.
        work = est.step_s.total - est.step_s.wan_sync - est.step_s.checkpoint
        return 4 / 40 * max(0.0, est.final_sync_s + extra - work)

    idle = _overlapped(_snap(cores=16), delay=1)
    assert idle.basis.exchange.share == 1.0
    assert idle.step_s.wan_sync == pytest.approx(exposed(idle, 0.0))
    shared = _overlapped(_snap(cores=2), delay=1)  # four slots on two cores
    b = shared.basis.exchange
    assert b.share > 1.0
    cpu = (b.fixed_s + b.params * b.param_s) * b.share  # the exchange's CPU work at that share
    assert shared.step_s.wan_sync == pytest.approx(exposed(shared, cpu))
    assert shared.step_s.wan_sync > exposed(shared, 0.0)


def test_the_delay_covers_the_exchange_beside_the_steps() -> None:
    spec = _spec()
    slow_exchange = Calibration(exchange_fixed_s={"eu|us": 0.5})
    est, runtime = estimate_planned(
        Placement(spec, _snap(cores=2), TWO_NODES, dp=4, tp=1, pp=1, zero=0, calibration=slow_exchange)
    )
    b = est.basis.exchange
    assert runtime.overlap and b.share > 1.0
    beside = est.final_sync_s + (b.fixed_s + b.params * b.param_s) * b.share
    work = est.step_s.total - est.step_s.wan_sync - est.step_s.checkpoint
    assert runtime.overlap_steps == min(10, math.ceil(beside / work - 1e-9))
    # The runtime lands the round after the steps the estimate hides it behind: nothing exposed.
    assert est.step_s.wan_sync == pytest.approx(4 / 40 * max(0.0, beside - runtime.overlap_steps * work))


COLLECTIVE = {"collective_call_s": 4e-4, "collective_gbps": 8.0, "collective_wait_s": 1.5e-3}


def test_a_nodes_ranks_all_reduce_at_the_hosts_measured_figures() -> None:
    """DP ranks on one host's CPU slots: every call (each gradient bucket and the loss, per step) a
    ring of 2(r−1) hops at half the measured two-rank call, the wait on every hop once ranks
    outnumber cores, the gradients at the measured rate slowed by σ."""
    spec = _spec()
    grad_bytes = cm.stage_params(spec.model, 1, 1) * cm.GRAD_BYTES
    # 1.9 MB of gradients: DDP's 1 MiB first bucket, a second one, and the loss.
    assert cm.ddp_calls_per_step(grad_bytes) == 3

    def dp_comm(snap: ResourceSnapshot, tasks: list[PlannedTask], dp: int) -> float:
        return estimate_option(Placement(spec, snap, tasks, dp=dp, tp=1, pp=1, zero=0)).step_s.dp_comm

    fabric = _snap(cores=2)
    measured = _snap(cores=2)
    for c in measured.clusters:
        for n in c.nodes:
            assert n.profile is not None
            n.profile = n.profile.model_copy(update=COLLECTIVE)
    payload = grad_bytes * 8 / 8e9  # 2(r−1)/r = 1 for two ranks
    # 2 slots on 2 cores (σ = 1): no wait.
    alone = dp_comm(measured, ONE_NODE, 2)
    assert alone == pytest.approx(3 * 2 * 2e-4 + payload)
    # 4 slots on the 2 cores (σ = 2): each hop waits, the payload takes twice as long.
    crowded = dp_comm(measured, TWO_NODES, 4)
    assert crowded == pytest.approx(3 * 2 * (2e-4 + 1.5e-3) + 2 * payload)
    # Without the figures the fabric's ring prices it, as before.
    cluster = fabric.clusters[0]
    ring = cm.dp_comm_s(spec, 1, 1, 0, 2, intra_bytes_per_s(cluster, None), cluster.intra_latency_ms / 1000)
    assert dp_comm(fabric, ONE_NODE, 2) == pytest.approx(float(ring))


def test_the_hosts_collective_by_hand() -> None:
    mib = 1024 * 1024
    assert cm.host_dp_comm_s(1e6, 1, 3.0, 1e-3, 1.0, 1.0) == 0.0  # one rank: nothing to reduce
    # DDP's buckets: 1 MiB first, 25 MiB after, one all-reduce each, and the loss's.
    sizes = (0.5 * mib, mib, 1.5 * mib, 26 * mib, 27 * mib)
    assert [cm.ddp_calls_per_step(b) for b in sizes] == [2, 2, 3, 3, 4]
    # 3 ranks, σ = 1.5: 4 hops per call at half the call and half the wait; 4/3 of the payload at σ.
    got = cm.host_dp_comm_s(0.5 * mib, 3, 1.5, 2e-4, 4.0, 1e-3)
    assert got == pytest.approx(2 * 4 * (1e-4 + 0.5 * 1e-3) + 4 / 3 * 0.5 * mib * 8 / 4e9 * 1.5)
    # Cores to spare (σ below 1): no wait, the payload at the measured rate.
    assert cm.host_dp_comm_s(0.5 * mib, 2, 0.5, 2e-4, 4.0, 1e-3) == pytest.approx(
        2 * 2 * 1e-4 + 0.5 * mib * 8 / 4e9
    )
    with pytest.raises(ValueError, match="call_s > 0 and gbps > 0"):
        cm.host_dp_comm_s(1e6, 2, 1.0, 0.0, 4.0, 0.0)
