"""Users' code (an entrypoint) is placed only on nodes that run it: sandboxed, or allowed
unsandboxed by their provider; the built-in trainer goes anywhere."""

from __future__ import annotations

from pathlib import Path

import pytest

from contracts.errors import NoFeasiblePlan
from control_layer.planner import JobSpec, ResourceSnapshot, plan

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
DEVICE = {"model": "A100-80GB", "memory_gb": 80, "tflops": 150}


def _snapshot(sandboxes: dict[str, str]) -> ResourceSnapshot:
    nodes = [
        {"id": node, "sandbox": sandbox, "devices": [{"index": i, **DEVICE} for i in range(4)]}
        for node, sandbox in sandboxes.items()
    ]
    return ResourceSnapshot.model_validate(
        {"clusters": [{"id": "c", "region": "r", "price_per_device_hour": 2.0, "nodes": nodes}]}
    )


def _specs() -> tuple[JobSpec, JobSpec]:
    builtin = JobSpec.from_yaml_or_json((EXAMPLES / "job-gpt-small.yaml").read_text())
    raw = builtin.model_dump()
    raw["qos"] = {**raw["qos"], "regions": None, "max_hours": None, "max_cost": None}
    raw["training"] = {**raw["training"], "steps": 2000, "warmup_steps": 100}
    builtin = JobSpec.model_validate(raw)
    return builtin, JobSpec.model_validate({**raw, "entrypoint": "mypkg.train:build"})


def test_users_code_goes_only_to_nodes_that_run_it_and_says_what_it_left_out() -> None:
    snap = _snapshot({"boxed": "bubblewrap", "bare": "none", "allowed": "unsandboxed-allowed"})
    builtin, byo = _specs()
    options = plan(byo, snap)
    assert options
    for o in options:
        assert {t.node for t in o.tasks} <= {"boxed", "allowed"}, o.tasks
        (check,) = [c for c in o.qos_checks if c.name == "sandbox"]
        assert check.ok
    # The built-in trainer may use every node, and states no sandbox check.
    used = {t.node for o in plan(builtin, snap) for t in o.tasks}
    assert "bare" in used
    assert all(c.name != "sandbox" for o in plan(builtin, snap) for c in o.qos_checks)


def test_with_no_node_that_runs_users_code_the_refusal_names_the_constraint() -> None:
    _, byo = _specs()
    with pytest.raises(NoFeasiblePlan) as err:
        plan(byo, _snapshot({"bare": "none", "other": "none"}))
    (step,) = [s for s in err.value.details["explanation"] if s["constraint"] == "entrypoint"]
    assert step["removed_devices"] == 8 and step["left_devices"] == 0
    assert "runs no users' code" in step["detail"]


def test_a_snapshot_refuses_an_unknown_sandbox() -> None:
    with pytest.raises(Exception, match="sandbox"):
        _snapshot({"n": "chroot"})
