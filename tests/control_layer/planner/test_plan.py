"""plan() end to end: the three-region example, a CPU fleet, pins, calibration, determinism."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from contracts.errors import InvalidArgument
from control_layer.planner import Calibration, JobSpec, ResourceSnapshot, estimate_option, plan
from control_layer.planner.node_groups import node_group_problems, node_groups
from control_layer.planner.placement import Placement

from .checks import check_front, check_option

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


@pytest.fixture(scope="module")
def example() -> tuple[JobSpec, ResourceSnapshot]:
    spec = JobSpec.from_yaml_or_json((EXAMPLES / "job-gpt-small.yaml").read_text())
    snap = ResourceSnapshot.from_json((EXAMPLES / "snapshot-3-regions.json").read_text())
    return spec, snap


def test_three_region_example(example) -> None:
    spec, snap = example
    options = plan(spec, snap)
    assert 2 <= len(options) <= 5
    labels = [o.label for o in options]
    assert {"cheapest", "fastest"} <= set(labels)
    assert options[0].label == "cheapest"  # objective: cost
    for o in options:
        check_option(spec, snap, o)
    check_front(options)
    fastest = next(o for o in options if o.label == "fastest")
    # 32 H100s are spread over two regions, so the fastest option pays for WAN sync.
    assert len(fastest.regions) == 2 and fastest.estimates.cost.egress > 0


def test_time_objective_puts_the_fastest_first(example) -> None:
    spec, snap = example
    spec = spec.model_copy(update={"qos": spec.qos.model_copy(update={"objective": "time"})})
    options = plan(spec, snap)
    assert options[0].label == "fastest"
    assert options[0].estimates.duration_s == min(o.estimates.duration_s for o in options)


def test_same_input_same_output(example) -> None:
    spec, snap = example
    first = [o.model_dump(mode="json") for o in plan(spec, snap)]
    again = [o.model_dump(mode="json") for o in plan(spec, snap)]
    assert first == again
    # Listing the clusters in another order is the same fleet.
    data = json.loads(snap.to_json())
    random.Random(7).shuffle(data["clusters"])
    shuffled = [o.model_dump(mode="json") for o in plan(spec, ResourceSnapshot.model_validate(data))]
    assert shuffled == first


def test_options_round_trip_through_json(example) -> None:
    spec, snap = example
    for o in plan(spec, snap):
        assert type(o).model_validate_json(o.model_dump_json()) == o


def test_cpu_fleet_and_tiny_model() -> None:
    snap = ResourceSnapshot.model_validate(
        {
            "regions": [{"name": "local"}],
            "clusters": [
                {
                    "id": f"cpu{i}",
                    "region": "local",
                    "price_per_device_hour": 0.01 * (i + 1),
                    "nodes": [
                        {
                            "id": f"node{i}",
                            "devices": [
                                {"index": k, "model": "cpu", "memory_gb": 4, "tflops": 0.05} for k in range(2)
                            ],
                        }
                    ],
                }
                for i in range(3)
            ],
        }
    )
    spec = JobSpec.model_validate(
        {
            "name": "demo",
            "model": {"n_layers": 2, "d_model": 64, "n_heads": 4, "vocab": 256, "seq_len": 64},
            "training": {"steps": 50, "global_batch_tokens": 64 * 8},
            "sync": {"mode": "diloco", "every": 10},
        }
    )
    options = plan(spec, snap)
    for o in options:
        check_option(spec, snap, o)
        assert o.precision == "fp32"  # 'auto' on CPUs: no native bf16
    assert options[0].label == "cheapest"
    assert any(o.dp > 1 for o in options)
    # Pinned bf16 on CPUs runs autocast without native support: priced 8x slower per FLOP.
    bf16 = JobSpec.model_validate(
        {**spec.model_dump(), "training": {**spec.training.model_dump(), "precision": "bf16"}}
    )
    slow = plan(bf16, snap, max_options=1)[0]
    assert slow.precision == "bf16" and slow.estimates.step_s.compute > options[0].estimates.step_s.compute


def test_auto_precision_is_bf16_on_cuda(example) -> None:
    spec, snap = example
    assert spec.training.precision == "auto"
    assert {o.precision for o in plan(spec, snap)} == {"bf16"}


def test_byo_entrypoint_is_planned_with_what_it_supports(example) -> None:
    spec, snap = example
    byo = JobSpec.model_validate({**spec.model_dump(), "entrypoint": "mypkg.train:build"})
    for o in plan(byo, snap):
        check_option(byo, snap, o)
        assert (o.tp, o.pp, o.zero) == (1, 1, 0)


def test_a_pipeline_spans_nodes_only_when_no_node_holds_a_replica() -> None:
    # A model too big for one 16 GB device, on nodes of one device each: each replica's pipeline
    # runs across nodes of the cluster, one torchrun group per replica, a stage per node.
    nodes = [
        {"id": f"n{i}", "devices": [{"index": 0, "model": "T4", "memory_gb": 16, "tflops": 60}]}
        for i in range(8)
    ]
    snap = ResourceSnapshot.model_validate(
        {"clusters": [{"id": "c", "region": "r", "price_per_device_hour": 1.0, "nodes": nodes}]}
    )
    spec = JobSpec.model_validate(
        {
            "name": "big",
            "model": {"n_layers": 8, "d_model": 4096, "n_heads": 32, "vocab": 50304, "seq_len": 1024},
            "training": {"steps": 10, "global_batch_tokens": 1024 * 8},
        }
    )
    spanning = plan(spec, snap)
    assert spanning
    for o in spanning:
        assert o.pp > 1 and o.tp == 1
        assert not node_group_problems(o.tasks)  # what the control plane launches
        assert len({(t.node, t.device) for t in o.tasks}) == len(o.tasks)
        groups = node_groups(o.tasks)
        assert len(groups) == o.dp and all(len(g) == o.pp for g in groups)
        again = estimate_option(
            Placement(spec, snap, o.tasks, dp=o.dp, tp=o.tp, pp=o.pp, zero=o.zero), runtime=o.runtime
        )
        assert again.duration_s == pytest.approx(o.estimates.duration_s)
    # The same eight devices on one node carry the pipeline.
    one = [
        {
            "id": "n0",
            "devices": [{"index": i, "model": "T4", "memory_gb": 16, "tflops": 60} for i in range(8)],
        }
    ]
    snap = ResourceSnapshot.model_validate(
        {"clusters": [{"id": "c", "region": "r", "price_per_device_hour": 1.0, "nodes": one}]}
    )
    for o in plan(spec, snap):
        check_option(spec, snap, o)
        assert o.tp * o.pp > 1


def test_pinned_degrees_are_respected(example) -> None:
    spec, snap = example
    pinned = JobSpec.model_validate(
        {**spec.model_dump(), "parallelism": {"dp": 4, "tp": 2, "pp": 1, "zero": 1}}
    )
    options = plan(pinned, snap)
    assert all((o.dp, o.tp, o.pp, o.zero) == (4, 2, 1, 1) for o in options)
    for o in options:
        check_option(pinned, snap, o)


def test_calibration_slows_what_it_measures(example) -> None:
    spec, snap = example
    spec = JobSpec.model_validate(
        {**spec.model_dump(), "parallelism": {"dp": 32, "tp": 1, "pp": 1, "zero": 0}}
    )
    base = plan(spec, snap, max_options=1)[0]
    assert base.estimates.basis is not None
    slow = Calibration(
        device_efficiency={key: 0.25 for key in base.estimates.basis.efficiency},
        link_goodput={key: 0.05 for key in base.estimates.basis.goodput},
    )
    again = estimate_option(
        Placement(
            spec, snap, base.tasks, dp=base.dp, tp=base.tp, pp=base.pp, zero=base.zero, calibration=slow
        )
    )
    assert again.duration_s > base.estimates.duration_s


def test_max_options(example) -> None:
    spec, snap = example
    assert len(plan(spec, snap, max_options=1)) == 1
    with pytest.raises(InvalidArgument):
        plan(spec, snap, max_options=0)
