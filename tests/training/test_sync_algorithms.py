"""The pure pieces: outer optimizer, averaging, schedules, staleness rules, gossip graphs."""

from __future__ import annotations

import pytest
import torch

from contracts.sync_config import SyncConfig
from training.sync.algorithms.gossip import exponential_peers, peers_for_round, push_sum_combine
from training.sync.algorithms.outer import eager_start, merge_late, outer_step, weighted_mean
from training.sync.algorithms.schedule import anchored_event, fragment_slices, is_apply, is_start
from training.sync.algorithms.staleness import async_scale, ssp_ready


def test_outer_step_with_lr_one_and_no_momentum_is_plain_averaging() -> None:
    anchor = torch.tensor([1.0, 2.0])
    locals_ = [torch.tensor([0.0, 2.0]), torch.tensor([2.0, 4.0])]
    g = weighted_mean([anchor - p for p in locals_], [1, 1])
    new, buf = outer_step(anchor, g, None, lr=1.0, mu=0.0)
    assert torch.allclose(new, torch.tensor([1.0, 3.0])) and buf is None


def test_nesterov_momentum_matches_the_textbook_update() -> None:
    g1, g2 = torch.tensor([1.0]), torch.tensor([0.5])
    a1, b1 = outer_step(torch.zeros(1), g1, None, lr=0.7, mu=0.9)
    assert torch.allclose(b1, g1) and torch.allclose(a1, -0.7 * (g1 + 0.9 * g1))
    a2, b2 = outer_step(a1, g2, b1, lr=0.7, mu=0.9)
    assert torch.allclose(b2, 0.9 * g1 + g2) and torch.allclose(a2, a1 - 0.7 * (g2 + 0.9 * b2))


def test_diloco_defaults_follow_the_paper() -> None:
    c = SyncConfig(mode="diloco", every=100)
    assert (c.effective_outer_lr, c.effective_outer_momentum) == (0.7, 0.9)
    assert (
        SyncConfig(mode="local_sgd").effective_outer_lr,
        SyncConfig(mode="local_sgd").effective_outer_momentum,
    ) == (1.0, 0.0)


def test_schedules() -> None:
    assert [s for s in range(1, 21) if is_start(s, 5)] == [5, 10, 15, 20]
    assert [s for s in range(1, 21) if is_apply(s, 5, 2)] == [7, 12, 17]
    events = [s for s in range(1, 21) if anchored_event(s, 10, 3, 20)]
    assert events == [1, 10, 13, 20]
    sl = fragment_slices(10, 3)
    assert [(s.start, s.stop) for s in sl] == [(0, 3), (3, 6), (6, 10)]


def test_config_rejects_inconsistent_settings() -> None:
    with pytest.raises(ValueError, match="divisible by fragments"):
        SyncConfig(mode="diloco", every=10, fragments=3)
    with pytest.raises(ValueError, match="overlap_steps"):
        SyncConfig(mode="diloco", every=10, fragments=2, overlap=True, overlap_steps=6)
    with pytest.raises(ValueError, match="itself"):
        SyncConfig(mode="gossip", gossip_graph=[{"a": ["a"]}])
    with pytest.raises(ValueError):
        SyncConfig(mode="diloco", links={"a|a": {"bandwidth_mbps": 1}})


def test_ssp_bound() -> None:
    assert ssp_ready(5, {"a": 4, "b": 3}, staleness=2) == []
    assert ssp_ready(5, {"a": 4, "b": 2}, staleness=2) == ["b"]
    assert ssp_ready(5, {"a": 4}, staleness=0) == ["a"]


def test_async_damping_counts_only_excess_staleness() -> None:
    assert async_scale(2, peers=3, damping="inverse") == 1.0  # two newer versions: a normal round
    assert async_scale(5, peers=3, damping="inverse") == pytest.approx(1 / 4)
    assert async_scale(5, peers=3, damping="sqrt") == pytest.approx(0.5)


def test_gossip_graph_is_time_varying_and_explicit_graphs_win() -> None:
    regions = ["a", "b", "c", "d"]
    assert [exponential_peers(regions, "a", r, 1) for r in range(3)] == [["b"], ["c"], ["b"]]
    assert peers_for_round(regions, "a", 1, 1, [{"a": ["d"]}, {"a": ["c", "b"]}]) == ["c", "b"]


def test_push_sum_preserves_mass() -> None:
    x, w = push_sum_combine(
        torch.tensor([2.0]), 0.5, [(torch.tensor([4.0]), 0.25), (torch.tensor([0.0]), 0.25)]
    )
    assert w == 1.0 and torch.allclose(x / w, torch.tensor([3.0]))


def test_an_overlapped_region_trains_on_from_its_own_outer_step() -> None:
    g = torch.Generator().manual_seed(3)
    anchor, momentum = torch.randn(64, generator=g), torch.randn(64, generator=g)
    sent = anchor - 0.01 * torch.randn(64, generator=g)
    start = eager_start(anchor, sent, momentum, 0.7, 0.9, True, "progress")
    assert start is not None
    want, _ = outer_step(anchor, anchor - sent, momentum, 0.7, 0.9)
    assert torch.equal(start, want) and not torch.allclose(start, sent)
    # Peers that did exactly what it did: the round lands where it already is, so the steps it
    # took meanwhile count in full and nothing is lost to the delay.
    later = start + 0.003 * torch.randn(64, generator=g)
    assert torch.allclose(merge_late(later, want, start, "progress", 0.5), later, atol=1e-6)
    # Streaming DiLoCo's mix, and an outer step that returns the parameters (local SGD): from there.
    assert eager_start(anchor, sent, momentum, 0.7, 0.9, True, "mix") is None
    assert eager_start(anchor, sent, None, 1.0, 0.0, True, "progress") is None
