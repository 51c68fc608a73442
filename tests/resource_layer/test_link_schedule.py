"""Which links get probed when: new links at once, then on the interval, never above the budget."""

from __future__ import annotations

from resource_layer.link_schedule import PairHistory, ProbeEndpoint, ProbePolicy, next_due, plan_round

POLICY = ProbePolicy(interval_s=600.0, budget=0.01)


def ep(node: str, region: str, registered_at: float = 0.0) -> ProbeEndpoint:
    return ProbeEndpoint(node, region, "127.0.0.1", 30000, registered_at)


def test_new_links_are_probed_at_once_with_each_node_in_one_probe() -> None:
    eps = [ep("a", "eu"), ep("b", "us"), ep("c", "ap"), ep("d", "sa")]
    plans = plan_round(eps, {}, set(), now=100.0, policy=POLICY)
    nodes = [n for p in plans for n in (p.src.node_id, p.dst.node_id)]
    assert len(plans) == 2 and len(nodes) == len(set(nodes))  # 4 nodes: two disjoint probes
    assert all(p.src.region != p.dst.region for p in plans)
    # Nodes with a probe pending sit the round out.
    assert plan_round(eps, {}, {"a", "b", "c"}, now=100.0, policy=POLICY) == []


def test_interval_and_budget_decide_when_a_link_is_probed_again() -> None:
    eps = [ep("a", "eu"), ep("b", "us")]
    done = {("eu", "us"): PairHistory(1000.0, 0.5, False), ("us", "eu"): PairHistory(1000.0, 0.5, False)}
    assert plan_round(eps, done, set(), now=1500.0, policy=POLICY) == []
    assert len(plan_round(eps, done, set(), now=1600.0, policy=POLICY)) == 1
    # A slow link: a 20 s probe may come back only after 20 / 1 % = 2000 s, not after the interval.
    slow = PairHistory(1000.0, 20.0, False)
    assert next_due(slow, POLICY) == 3000.0
    assert plan_round(eps, {("eu", "us"): slow, ("us", "eu"): slow}, set(), 2999.0, POLICY) == []
    # A pending probe is waited for, however late.
    pending = PairHistory(0.0, None, True)
    assert plan_round(eps, {("eu", "us"): pending, ("us", "eu"): pending}, set(), 1e9, POLICY) == []


def test_a_newly_registered_node_has_its_links_probed_within_the_budget() -> None:
    h = {("eu", "us"): PairHistory(1000.0, 0.5, False), ("us", "eu"): PairHistory(1000.0, 0.5, False)}
    eps = [ep("a", "eu", registered_at=0.0), ep("b2", "us", registered_at=1010.0), ep("b", "us", 5.0)]
    # b2 registered after the last probe: it represents us-east now and is probed before the interval,
    plans = plan_round(eps, h, set(), now=1060.0, policy=POLICY)
    assert len(plans) == 1 and "b2" in (plans[0].src.node_id, plans[0].dst.node_id)
    # but not within 0.5 s / 1 % = 50 s of the last probe, however often it re-registers.
    assert plan_round(eps, h, set(), now=1049.0, policy=POLICY) == []
