"""Properties of every quote on random small fleets and jobs with random QoS constraints."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from contracts.errors import NoFeasiblePlan
from control_layer.planner import plan

from .checks import check_front, check_option
from .fleetgen import jobs, snapshots


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(snap=snapshots(), spec=jobs())
def test_quotes_keep_every_constraint_and_add_up(snap, spec) -> None:
    try:
        options = plan(spec, snap)
    except NoFeasiblePlan as exc:
        explanation = exc.details["explanation"]
        assert explanation and all("constraint" in e and "detail" in e for e in explanation)
        return
    assert 1 <= len(options) <= 5
    for o in options:
        check_option(spec, snap, o)  # QoS, memory, placement rules, breakdowns, re-estimation
    check_front(options)
    key = (
        (lambda o: o.estimates.duration_s)
        if spec.qos.objective == "time"
        else (lambda o: o.estimates.cost.total)
    )
    assert key(options[0]) == min(key(o) for o in options)
    assert [o.model_dump() for o in plan(spec, snap)] == [o.model_dump() for o in options]
