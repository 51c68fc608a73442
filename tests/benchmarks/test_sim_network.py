"""The simulator's flow network and collectives against closed forms."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.sim.collectives import all_gather, all_reduce, exchange
from benchmarks.sim.network import Network


def test_one_flow_takes_bytes_over_bandwidth_plus_latency() -> None:
    net = Network({"l": 100.0})
    done: list[float] = []
    net.send(["l"], 500.0, 0.25, lambda: done.append(net.now), label="l")
    net.run()
    assert done == [pytest.approx(5.25)]
    assert net.bytes_on == {"l": 500.0}


def test_two_flows_on_one_link_each_take_twice_as_long() -> None:
    net = Network({"l": 100.0})
    done: list[float] = []
    for _ in range(2):
        net.send(["l"], 500.0, 0.0, lambda: done.append(net.now))
    net.run()
    assert done == [pytest.approx(10.0), pytest.approx(10.0)]


def test_a_flow_speeds_up_when_the_other_finishes() -> None:
    # 100 and 300 bytes on a 100 B/s link: both at 50 B/s until t=2, then the second alone at 100.
    net = Network({"l": 100.0})
    done: dict[str, float] = {}
    net.send(["l"], 100.0, 0.0, lambda: done.setdefault("short", net.now))
    net.send(["l"], 300.0, 0.0, lambda: done.setdefault("long", net.now))
    net.run()
    assert done == {"short": pytest.approx(2.0), "long": pytest.approx(4.0)}


def test_max_min_fairness_gives_the_unshared_flow_what_the_bottleneck_leaves() -> None:
    # a crosses x (cap 10) and y (cap 100); b crosses y only. a is held to 10 by x, b gets the other 90.
    net = Network({"x": 10.0, "y": 100.0})
    done: dict[str, float] = {}
    net.send(["x", "y"], 10.0, 0.0, lambda: done.setdefault("a", net.now))
    net.send(["y"], 90.0, 0.0, lambda: done.setdefault("b", net.now))
    net.run()
    assert done == {"a": pytest.approx(1.0), "b": pytest.approx(1.0)}


def _ring_route(bandwidth: float, latency: float):
    def route(a: object, b: object) -> tuple[tuple[object, ...], float, str]:
        return (("out", a), ("in", b)), latency, f"{a}->{b}"

    return route


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 9), x=st.floats(1.0, 1e9), bw=st.floats(1.0, 1e9), lat=st.floats(0.0, 1.0))
def test_ring_all_reduce_moves_2_n_minus_1_over_n_and_takes_the_ring_time(
    n: int, x: float, bw: float, lat: float
) -> None:
    peers = list(range(n))
    capacity = {(d, p): bw for p in peers for d in ("out", "in")}
    net = Network(capacity)
    done: list[float] = []
    all_reduce(net, _ring_route(bw, lat), peers, x, lambda: done.append(net.now)).start()
    end = net.run()
    assert len(done) == 1
    sent = {p: net.bytes_on.get(f"{p}->{(p + 1) % n}", 0.0) for p in peers}
    for p in peers:
        assert sent[p] == pytest.approx(2 * (n - 1) / n * x if n > 1 else 0.0)
    expected = 2 * (n - 1) * (x / n / bw + lat)
    assert end == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_ring_all_gather_moves_n_minus_1_payloads() -> None:
    peers = [0, 1, 2, 3]
    net = Network({(d, p): 10.0 for p in peers for d in ("out", "in")})
    all_gather(net, _ring_route(10.0, 0.5), peers, 20.0, lambda: None).start()
    assert net.run() == pytest.approx(3 * (20.0 / 10.0 + 0.5))
    assert net.bytes_on["0->1"] == 60.0


def test_a_slow_hop_sets_the_ring_pace() -> None:
    # 3 peers, one hop at a tenth of the others: every step waits on it in steady state.
    peers = [0, 1, 2]
    cap = {(d, p): 100.0 for p in peers for d in ("out", "in")}
    cap[("out", 2)] = 10.0
    net = Network(cap)
    all_reduce(net, _ring_route(100.0, 0.0), peers, 300.0, lambda: None).start()
    fast = Network({(d, p): 100.0 for p in peers for d in ("out", "in")})
    all_reduce(fast, _ring_route(100.0, 0.0), peers, 300.0, lambda: None).start()
    assert net.run() > fast.run() * 3


@settings(max_examples=30, deadline=None)
@given(n=st.integers(2, 7), x=st.floats(1.0, 1e9), bw=st.floats(1.0, 1e9), lat=st.floats(0.0, 1.0))
def test_a_ring_of_calls_waits_for_each_answer(n: int, x: float, bw: float, lat: float) -> None:
    # Between sync participants each send is a call: the next step waits for its answer (one
    # more latency) and the call's fixed seconds, 2(n-1) times: the planner's ring formula.
    peers = list(range(n))
    net = Network({(d, p): bw for p in peers for d in ("out", "in")})
    all_reduce(net, _ring_route(bw, lat), peers, x, lambda: None, call_s=0.003).start()
    expected = 2 * (n - 1) * (x / n / bw + 2 * lat + 0.003)
    assert net.run() == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_pushes_as_calls_end_when_answered() -> None:
    peers = [0, 1, 2]
    net = Network({(d, p): 10.0 for p in peers for d in ("out", "in")})
    edges = [(a, b) for a in peers for b in peers if a != b]
    exchange(net, _ring_route(10.0, 0.5), edges, 20.0, lambda: None, call_s=0.25)
    # Each peer's port carries its two pushes at half the rate: 4 s, then 0.5 there and back
    # plus the call's 0.25.
    assert net.run() == pytest.approx(4.0 + 0.5 + 0.5 + 0.25)
