"""The search sees each node's own port: where nodes declare NICs slower (or faster) than their
cluster's fabric, an exchange between nodes crosses their ports in the search's objective, its
bounds and its MILP as in the estimator (``problem.Fleet.cls_port_bw``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from . import test_search as base
from .fleetgen import jobs, snapshots

FAST = base.FAST


@FAST
@given(snap=snapshots(ports=True), spec=jobs(with_qos=False), pick=st.randoms(use_true_random=False))
def test_estimator_agrees_with_the_search_objective_over_node_ports(snap, spec, pick) -> None:
    base.test_estimator_agrees_with_the_search_objective.hypothesis.inner_test(snap, spec, pick)


@FAST
@given(snap=snapshots(ports=True), spec=jobs(with_qos=False))
def test_lower_bounds_never_exceed_the_best_placement_over_node_ports(snap, spec) -> None:
    base.test_lower_bounds_never_exceed_the_best_placement.hypothesis.inner_test(snap, spec)


@FAST
@given(snap=snapshots(max_clusters=4, ports=True), spec=jobs(with_qos=False))
def test_milp_is_exact_for_its_candidate_over_node_ports(snap, spec) -> None:
    base.test_milp_is_exact_for_its_candidate.hypothesis.inner_test(snap, spec)
