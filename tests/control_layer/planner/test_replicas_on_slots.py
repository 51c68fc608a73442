"""Spanning prices its placements from their slot lists (``replicas_on_slots``), not by reading
the tasks back: what it reads must be what ``replicas_of`` reads from the tasks, and a group the
tasks could not run as must be refused the same way."""

from __future__ import annotations

import pytest

from contracts.errors import InvalidArgument
from control_layer.planner import plan
from control_layer.planner.node_groups import node_group_problems, node_groups
from control_layer.planner.plan_types import PlannedTask, PlanOption
from control_layer.planner.replicas import replicas_of, replicas_on_slots
from control_layer.planner.snapshot import ResourceSnapshot
from tests.control_layer.planner.test_cross_region_pipelines import _regions
from tests.control_layer.planner.test_node_fabric import BIG, SMALL, _big_snapshot, _spanning

Slots = list[list[tuple[str, str, int]]]


def _slots(option: PlanOption) -> Slots:
    """The option's slot lists: per dp rank, its devices in (stage, tp rank) order."""
    out: Slots = [[] for _ in range(option.dp)]
    for t in sorted(option.tasks, key=lambda t: (t.dp_rank, t.pp_stage, t.tp_rank)):
        out[t.dp_rank].append((t.cluster, t.node, t.device))
    return out


def _declared(snap: ResourceSnapshot) -> ResourceSnapshot:
    data = snap.model_dump()
    for c in data["clusters"]:
        for n in c["nodes"]:
            n["cross_cluster_groups"] = True
    return ResourceSnapshot.model_validate(data)


def _spanning_options(case: str) -> tuple[ResourceSnapshot, list[PlanOption]]:
    if case == "alike ports":
        snap = _big_snapshot([200.0] * 8)
    elif case == "mixed ports":
        snap = _big_snapshot([400.0, 25.0, 100.0, 400.0, 12.5, 200.0, 400.0, 50.0])
    else:  # replicas across clusters and regions, on the front beside one-cluster ones
        clusters = [("a", "eu", 3, 2, 1.0), ("b", "us", 3, 2, 2.0), ("c", "eu", 2, 2, 3.0)]
        snap = _regions(clusters, (10.0, 20.0, 0.01), device=SMALL)
        return snap, plan(BIG, snap)
    return snap, _spanning(BIG, snap)


@pytest.mark.parametrize("case", ["alike ports", "mixed ports", "across regions"])
def test_the_replicas_read_from_slots_are_those_read_from_the_tasks(case: str) -> None:
    snap, options = _spanning_options(case)
    spanning = [
        o for o in options if any(len({t.node for t in o.tasks if t.dp_rank == r}) > 1 for r in range(o.dp))
    ]
    assert spanning
    for opt in spanning:
        from_slots = replicas_on_slots(snap, _slots(opt), opt.tp, opt.pp)
        assert from_slots == replicas_of(snap, opt.tasks, opt.dp, opt.tp, opt.pp)
        assert [list(r.all_nodes) for r in from_slots] == node_groups(opt.tasks)
    if case == "across regions":
        assert any(len({t.region for t in o.tasks}) == 2 for o in spanning)


def test_a_group_over_a_public_link_is_refused_as_the_tasks_would_be() -> None:
    """Both nodes declared their group endpoint reachable, but the link between their regions is
    not declared private: the same refusal, with the same reason, as from the tasks."""
    snap = _declared(_regions([("a", "eu", 1, 2, 1.0), ("b", "us", 1, 2, 1.0)], private=False))
    placed = [[("a", "a0", 0), ("b", "b0", 0)]]
    tasks = [
        PlannedTask(
            dp_rank=0, pp_stage=s, tp_rank=0, cluster=c, node=n, device=d, region={"a": "eu", "b": "us"}[c]
        )
        for s, (c, n, d) in enumerate(placed[0])
    ]
    with pytest.raises(InvalidArgument, match="not declared private") as from_slots:
        replicas_on_slots(snap, placed, 1, 2)
    with pytest.raises(InvalidArgument) as from_tasks:
        replicas_of(snap, tasks, 1, 1, 2)
    assert from_slots.value.message == from_tasks.value.message
    assert node_group_problems(tasks, {"a0", "b0"}, lambda a, b: False) == [from_slots.value.message]


def test_slot_lists_that_share_a_node_or_leave_and_return_to_one_are_a_callers_error() -> None:
    snap = _big_snapshot([200.0] * 8)
    with pytest.raises(ValueError, match="one run"):
        replicas_on_slots(snap, [[("c", "n0", 0)], [("c", "n0", 1)]], 1, 1)
    with pytest.raises(ValueError, match="one run"):
        replicas_on_slots(snap, [[("c", "n0", 0), ("c", "n1", 0), ("c", "n0", 1)]], 1, 3)


def test_a_replica_read_before_is_reused_only_for_the_same_rank_tp_and_slots() -> None:
    """Layouts of one shape share their first replicas; the same slots at another tp are another
    replica (other stage boundaries)."""
    snap = _big_snapshot([200.0] * 8)
    four = [
        [("c", f"n{2 * r}", 0), ("c", f"n{2 * r}", 1), ("c", f"n{2 * r + 1}", 0), ("c", f"n{2 * r + 1}", 1)]
        for r in range(4)
    ]
    memo: dict = {}
    first = replicas_on_slots(snap, four[:2], 1, 4, memo)
    again = replicas_on_slots(snap, four, 1, 4, memo)
    assert again[:2] == first and again[0] is first[0] and len(memo) == 4
    assert again == replicas_on_slots(snap, four, 1, 4)
    wide = replicas_on_slots(snap, four, 2, 2, memo)
    assert wide == replicas_on_slots(snap, four, 2, 2) and wide[0] is not again[0]
    assert wide[0].boundaries != again[0].boundaries
