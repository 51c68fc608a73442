"""Tensor-parallel groups go inside a node's NVLink islands: on a PCIe node whose bridges join
GPUs 0-2 and 1-3, a TP-2 replica takes a bridged pair, not GPUs 0 and 1. A node whose devices'
islands are not known keeps index order (the planner digest of CPU fleets is unchanged)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from control_layer.planner import JobSpec, ResourceSnapshot, plan
from control_layer.planner.fleet import island_order
from control_layer.planner.snapshot import DeviceSlot

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
GPU = {"model": "NVIDIA A100 80GB PCIe", "memory_gb": 80, "tflops": 250, "kind": "cuda"}


def _snapshot(islands: list[int]) -> ResourceSnapshot:
    devices = [{"index": i, "link_group": g, **GPU} for i, g in enumerate(islands)]
    return ResourceSnapshot.model_validate(
        {"clusters": [{"id": "c", "region": "r", "price_per_device_hour": 2.0,
                       "nodes": [{"id": "n", "devices": devices}]}]}
    )  # fmt: skip


def _tp2_spec() -> JobSpec:
    raw = JobSpec.from_yaml_or_json((EXAMPLES / "job-gpt-small.yaml").read_text()).model_dump()
    raw["qos"] = {**raw["qos"], "regions": None, "max_hours": None, "max_cost": None}
    raw["parallelism"] = {"dp": 2, "tp": 2, "pp": 1}
    return JobSpec.model_validate(raw)


def _tp_groups(islands: list[int]) -> set[tuple[int, ...]]:
    options = plan(_tp2_spec(), _snapshot(islands))
    assert options
    groups: set[tuple[int, ...]] = set()
    for o in options:
        by_replica: dict[int, list[int]] = defaultdict(list)
        for t in sorted(o.tasks, key=lambda t: t.tp_rank):
            by_replica[t.dp_rank].append(t.device)
        groups |= {tuple(sorted(d)) for d in by_replica.values()}
    return groups


def test_tp_groups_stay_inside_nvlink_islands() -> None:
    assert _tp_groups([0, 1, 0, 1]) == {(0, 2), (1, 3)}
    assert _tp_groups([0, 0, 1, 1]) == {(0, 1), (2, 3)}
    assert _tp_groups([-1, -1, -1, -1]) == {(0, 1), (2, 3)}  # not known: index order


def test_island_order_keeps_each_island_together_in_index_order() -> None:
    def slots(islands: list[int]) -> list[DeviceSlot]:
        return [DeviceSlot(index=i, link_group=g, **GPU) for i, g in enumerate(islands)]

    assert island_order(slots([1, 0, 1, 0, 2, 2])) == (1, 3, 0, 2, 4, 5)
    assert island_order(slots([-1] * 4)) == (0, 1, 2, 3)
    assert island_order(slots([0] * 8)) == tuple(range(8))
