"""Spanning tries distinct layouts: ZeRO has no shard group when every replica is a torchrun
group of its own, so a higher stage never improves a spanning placement (FSDP2 over a group of
one shards nothing and keeps its gathered copy beside the parameters, as the worker runs it), and
no ZeRO copy of a layout takes the place of another layout."""

from __future__ import annotations

import pytest

from control_layer.planner import estimate_option
from control_layer.planner.placement import Placement
from control_layer.planner.search import with_precision
from tests.control_layer.planner.test_node_fabric import BIG, _big_snapshot, _spanning


def test_zero_never_improves_a_spanning_placement() -> None:
    snap = _big_snapshot([200.0] * 8)
    options = _spanning(BIG, snap)
    assert options
    for opt in options:
        spec = with_precision(BIG, opt.precision)
        kw = dict(dp=opt.dp, tp=opt.tp, pp=opt.pp)
        base = estimate_option(Placement(spec, snap, opt.tasks, zero=0, **kw))
        for zero in (1, 2, 3):
            est = estimate_option(Placement(spec, snap, opt.tasks, zero=zero, **kw))
            assert est.duration_s == pytest.approx(base.duration_s)
            assert est.cost.total == pytest.approx(base.cost.total)
            # FSDP2 wraps the replica for any stage: over a group of one it keeps the whole
            # parameters and gathers a second copy of them for the step.
            assert est.memory_per_device_gb > base.memory_per_device_gb
        one, two = (estimate_option(Placement(spec, snap, opt.tasks, zero=z, **kw)) for z in (1, 2))
        assert (
            one.memory_per_device_gb == two.memory_per_device_gb
        )  # the worker runs ZeRO-1 and -2 alike (FSDP2 keeping parameters gathered)


def test_spanning_offers_one_option_per_layout_and_device_set() -> None:
    snap = _big_snapshot([200.0] * 8)
    options = _spanning(BIG, snap)
    assert {o.zero for o in options} == {0}
    layouts = [(o.dp, o.tp, o.pp, tuple((t.node, t.device) for t in o.tasks)) for o in options]
    assert len(layouts) == len(set(layouts))
    assert len({(o.dp, o.tp, o.pp) for o in options}) >= 2  # distinct layouts, not copies
