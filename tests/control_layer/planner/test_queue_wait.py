"""A scheduler's queue in the quote: a Slurm-backed node's reported wait (corrected by what its
tasks' measured waits taught) comes before the run in the option's duration, costs nothing, and
holds every option whose tasks use that node."""

from __future__ import annotations

from control_layer.capacity import with_devices_free
from control_layer.planner import Calibration, JobSpec, ResourceSnapshot, plan
from control_layer.planner.queue_wait import node_queue_wait_s, price_queue_wait

PRICES = {"slurm": 0.01, "local": 0.05}


def snap(wait_s: float) -> ResourceSnapshot:
    clusters = [
        {
            "id": name,
            "region": "eu",
            "price_per_device_hour": price,
            "nodes": [
                {
                    "id": f"{name}-n",
                    "devices": [
                        {"index": k, "model": "cpu", "memory_gb": 4, "tflops": 0.05} for k in range(2)
                    ],
                    "queue_wait_s": wait_s if name == "slurm" else 0.0,
                }
            ],
        }
        for name, price in PRICES.items()
    ]
    return ResourceSnapshot.model_validate({"regions": [{"name": "eu"}], "clusters": clusters, "links": []})


def job(objective: str = "cost") -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "queued",
            "model": {"n_layers": 2, "d_model": 64, "n_heads": 4, "vocab": 256, "seq_len": 64},
            "training": {"steps": 50, "global_batch_tokens": 64 * 8},
            "qos": {"objective": objective},
        }
    )


def clusters_of(option) -> set[str]:
    return {t.cluster for t in option.tasks}


def test_the_reported_wait_comes_before_the_run_and_costs_nothing() -> None:
    spec = job()
    plain = next(o for o in plan(spec, snap(0.0)) if clusters_of(o) == {"slurm"})
    assert "queue_wait_s" not in plain.estimates.model_dump()  # no queue: the quote reads as before
    queued = next(o for o in plan(spec, snap(120.0)) if clusters_of(o) == {"slurm"})
    assert queued.estimates.queue_wait_s == 120.0
    assert queued.estimates.duration_s == plain.estimates.duration_s + 120.0
    assert queued.estimates.cost.total == plain.estimates.cost.total


def test_the_learned_correction_applies_to_the_nodes_report_and_never_below_zero() -> None:
    learned = Calibration(queue_wait_s={"slurm-n": -30.0})
    assert node_queue_wait_s(120.0, "slurm-n", learned) == 90.0
    assert node_queue_wait_s(10.0, "slurm-n", learned) == 0.0
    assert node_queue_wait_s(10.0, "other", learned) == 10.0
    option = next(o for o in plan(job(), snap(0.0)) if clusters_of(o) == {"slurm"})
    late = Calibration(queue_wait_s={"slurm-n": 45.0})  # it always started later than reported
    priced = price_queue_wait(option, snap(0.0), late)
    assert priced.estimates.queue_wait_s == 45.0
    assert priced.estimates.duration_s == option.estimates.duration_s + 45.0


def test_every_option_on_the_queued_node_waits_for_it_and_only_those() -> None:
    """The tasks start together: an option spanning both clusters waits for the queued one."""
    options = plan(job("time"), snap(3600.0))
    assert any("slurm" in clusters_of(o) for o in options)
    for o in options:
        assert o.estimates.queue_wait_s == (3600.0 if "slurm" in clusters_of(o) else None)


def test_a_node_whose_wait_alone_passes_the_time_bound_is_left_out_of_the_search() -> None:
    """A day's queue (a drained cluster, say) against a one-hour bound: the job goes to the
    cluster without a queue rather than failing on options the wait rules out; with every device
    free and no queue (whether it could ever run), the queued cluster is back."""
    spec = job().model_copy(update={"qos": job().qos.model_copy(update={"max_hours": 1.0})})
    options = plan(spec, snap(86400.0))
    assert options and all(clusters_of(o) == {"local"} for o in options)
    assert any("slurm" in clusters_of(o) for o in plan(spec, with_devices_free(snap(86400.0))))
