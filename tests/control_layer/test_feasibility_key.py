"""The placer's "could it ever fit" cache key drops only what the planner never reads."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.errors import NoFeasiblePlan
from contracts.job_spec import JobSpec
from control_layer.placer import feasibility_key
from control_layer.planner import plan
from control_layer.planner.snapshot import ResourceSnapshot

from .planner.fleetgen import jobs, snapshots


def _outcome(spec: JobSpec, snap: ResourceSnapshot) -> object:
    try:
        return [o.model_dump() for o in plan(spec, snap)]
    except NoFeasiblePlan as exc:
        return exc.message


def _varied(spec: JobSpec, seed: int, lr: float) -> JobSpec:
    return spec.model_copy(
        update={
            "name": f"other-{seed}",
            "data": spec.data.model_copy(update={"seed": seed}),
            "training": spec.training.model_copy(
                update={"lr": lr, "seed": seed, "grad_clip": 0.5, "weight_decay": 0.0, "warmup_steps": 0}
            ),
        }
    )


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(
    snap=snapshots(),
    spec=jobs(),
    seed=st.integers(min_value=0, max_value=10_000),
    lr=st.floats(min_value=1e-5, max_value=1.0),
)
def test_specs_equal_under_the_key_plan_alike(snap, spec, seed, lr) -> None:
    other = _varied(spec, seed, lr)
    a, b = spec.model_dump(mode="json"), other.model_dump(mode="json")
    assert feasibility_key(a, "cheapest") == feasibility_key(b, "cheapest")
    assert _outcome(spec, snap) == _outcome(other, snap)


@settings(max_examples=10, deadline=None, derandomize=True)
@given(spec=jobs())
def test_what_the_planner_reads_changes_the_key(spec) -> None:
    base = spec.model_dump(mode="json")
    more_steps = spec.model_copy(
        update={"training": spec.training.model_copy(update={"steps": spec.training.steps + 1})}
    )
    elsewhere = spec.model_copy(update={"data": spec.data.model_copy(update={"region": "zz-far"})})
    key = feasibility_key(base, "cheapest")
    assert key != feasibility_key(more_steps.model_dump(mode="json"), "cheapest")
    assert key != feasibility_key(elsewhere.model_dump(mode="json"), "cheapest")
    assert key != feasibility_key(base, "fastest")
