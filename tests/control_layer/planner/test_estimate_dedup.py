"""estimate_planned prices replicas alike in what prices them once, whatever nodes or clusters
hold them, and never merges replicas that differ in one measured figure."""

from __future__ import annotations

import pytest

from contracts.job_spec import JobSpec
from control_layer.planner.estimate import estimate_planned
from control_layer.planner.placement import Placement
from control_layer.planner.plan_types import Estimates, PlannedTask
from control_layer.planner.snapshot import ResourceSnapshot

RATE = {
    "tflops": 50.0,
    "micro_batch_s": 0.004,
    "step_s": 0.002,
    "optimizer_s_per_mparam": 0.01,
    "data_s_per_mtoken": 10.0,
    "checkpoint_s_per_mparam": 0.2,
}
FIELDS = [k for k in RATE if k != "tflops"]


def _snap(rate_a: dict, rate_b: dict) -> ResourceSnapshot:
    """Two one-node clusters alike in all but their nodes' measured rates, in one region."""

    def cluster(cid: str, rate: dict) -> dict:
        node = {
            "id": f"{cid}0",
            "devices": [{"index": 0, "model": "NVIDIA L4", "memory_gb": 24, "tflops": 100.0}],
            "profile": {"startup_s": 5.0, "teardown_s": 0.5, "rates": {"fp32": rate, "bf16": rate}},
        }
        return {"id": cid, "region": "eu", "price_per_device_hour": 1.0, "nodes": [node]}

    return ResourceSnapshot.model_validate(
        {"regions": [{"name": "eu"}], "clusters": [cluster("a", rate_a), cluster("b", rate_b)]}
    )


SPEC = JobSpec.model_validate(
    {
        "name": "t",
        "model": {"n_layers": 2, "d_model": 128, "n_heads": 4, "vocab": 256, "seq_len": 64},
        "training": {"steps": 40, "global_batch_tokens": 64 * 8, "precision": "fp32"},
        "sync": {"mode": "diloco", "every": 10},
    }
)
TASKS = [
    PlannedTask(dp_rank=0, pp_stage=0, tp_rank=0, cluster="a", node="a0", device=0),
    PlannedTask(dp_rank=1, pp_stage=0, tp_rank=0, cluster="b", node="b0", device=0),
]


def _est(snap: ResourceSnapshot) -> Estimates:
    return estimate_planned(Placement(SPEC, snap, TASKS, dp=2, tp=1, pp=1, zero=0))[0]


@pytest.mark.parametrize("field", FIELDS)
def test_a_replica_differing_in_one_measured_figure_is_priced_apart(field: str) -> None:
    slower = {**RATE, field: RATE[field] * 3}
    mixed = _est(_snap(RATE, slower))  # the faster replica comes first
    assert mixed.step_s.total == pytest.approx(_est(_snap(slower, slower)).step_s.total)
    assert mixed.step_s.total > _est(_snap(RATE, RATE)).step_s.total


def test_a_slower_rate_on_the_second_replica_paces_the_step() -> None:
    slower = {**RATE, "tflops": RATE["tflops"] / 4}
    mixed = _est(_snap(RATE, slower))
    assert mixed.step_s.compute == pytest.approx(_est(_snap(slower, slower)).step_s.compute)
    assert mixed.step_s.compute > _est(_snap(RATE, RATE)).step_s.compute
