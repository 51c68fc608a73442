"""The dense exchange between region leaders over real gRPC: a ring with 3+ regions (each region
sends 2(R-1)/R of the payload), all-to-all with 2, the same bits everywhere either way."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from contracts.sync_config import SyncConfig
from training.sync import pipeline
from training.sync.algorithms.ring import all_gather_step, owned_chunk, reduce_scatter_step, ring_members
from training.sync.collective import Reduced
from training.sync.engine import create_engine


@pytest.mark.parametrize("size", [3, 4, 7])
def test_ring_schedule_reduces_every_chunk_once_per_region_and_gathers_all(size: int) -> None:
    # Simulate the schedule symbolically: a chunk's value is the set of regions summed into it.
    held = [[{i} for _ in range(size)] for i in range(size)]
    for k in range(size - 1):
        sent = [held[i][reduce_scatter_step(i, k, size)[0]] for i in range(size)]
        for i in range(size):
            recv = reduce_scatter_step(i, k, size)[1]
            assert reduce_scatter_step((i - 1) % size, k, size)[0] == recv
            held[i][recv] = sent[(i - 1) % size] | {i}
    for i in range(size):
        assert held[i][owned_chunk(i, size)] == set(range(size))
    have = [{owned_chunk(i, size)} for i in range(size)]
    for k in range(size - 1):
        fwd = [all_gather_step(i, k, size)[0] for i in range(size)]
        for i in range(size):
            assert fwd[i] in have[i]
            recv = all_gather_step(i, k, size)[1]
            assert fwd[(i - 1) % size] == recv
            have[i].add(recv)
    assert all(h == set(range(size)) for h in have)


def test_ring_members_follow_the_order_and_skip_dead_regions() -> None:
    assert ring_members(["c", "a", "d", "b"], ["a", "b", "c"]) == ["c", "a", "b"]
    assert ring_members(None, ["b", "a"]) == ["a", "b"]
    assert ring_members(["b"], ["a", "b", "c"]) == ["b", "a", "c"]


def reduce_everywhere(
    tmp: Path, xs: dict[str, torch.Tensor], weights: dict[str, float], rounds: int = 1, **sync: object
) -> tuple[dict[str, list[torch.Tensor]], dict[str, int], dict[str, bool]]:
    regions = sorted(xs)
    cfg = {"peers": dict.fromkeys(regions, ""), "rendezvous_dir": str(tmp), "timeout_s": 10} | sync
    engines = {
        r: create_engine(
            SyncConfig(mode="local_sgd", land_on_arrival=False, **cfg),
            region=r,
            total_steps=10,
            weight=weights[r],
        )
        for r in regions
    }
    out: dict[str, list[torch.Tensor]] = {r: [] for r in regions}
    rings: dict[str, bool] = {}

    def go(r: str) -> None:
        red = engines[r].strategy.reducers[0]
        for i in range(rounds):
            res = red.reduce(i, xs[r], weights[r], "", 1, 10.0)
            out[r].append(res.avg)
            rings[r] = res.ring

    try:
        threads = [threading.Thread(target=go, args=(r,)) for r in regions]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        sent = {r: sum(engines[r].node.stats.take()["bytes_sent"].values()) for r in regions}
    finally:
        for e in engines.values():
            e.node.close()
    return out, sent, rings


@pytest.mark.parametrize("n_regions", [2, 3, 4])
def test_weighted_average_is_exact_and_identical_and_the_ring_sends_less(
    tmp_path: Path, n_regions: int
) -> None:
    regions = [f"r{i}" for i in range(n_regions)]
    gen = torch.Generator().manual_seed(0)
    xs = {r: torch.randn(30_000, generator=gen) for r in regions}
    weights = {r: float(i + 1) for i, r in enumerate(regions)}
    out, sent, rings = reduce_everywhere(tmp_path, xs, weights, ring_order=list(reversed(regions)))
    want = sum(weights[r] * xs[r] for r in regions) / sum(weights.values())
    first = out[regions[0]][0]
    assert all(torch.equal(out[r][0], first) for r in regions)
    assert torch.allclose(first, want, atol=1e-5)
    payload = 4 * 30_000
    per_region = 2 * (n_regions - 1) / n_regions if n_regions >= 3 else n_regions - 1
    assert all(rings[r] == (n_regions >= 3) for r in regions)
    for r in regions:
        assert per_region * payload <= sent[r] <= per_region * payload * 1.05, (r, sent[r])


@pytest.mark.parametrize("compression", ["none", "int8"])
def test_a_ring_in_parts_passed_on_as_they_arrive_gives_the_same_bits_everywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compression: str
) -> None:
    # 30,000 elements over 3 regions: chunks of 10,000, each in 3 parts of at most 4,096 (they
    # travel as separate pushes, each passed on to the next hop as soon as it is in).
    regions = ["a", "b", "c"]
    gen = torch.Generator().manual_seed(2)
    xs = {r: torch.randn(30_000, generator=gen) for r in regions}
    weights = {"a": 1.0, "b": 2.0, "c": 3.0}
    whole, sent_whole, _ = reduce_everywhere(
        tmp_path / "whole", xs, weights, rounds=3, compression=compression
    )
    monkeypatch.setattr(pipeline, "PART_ELEMS", 4096)
    assert len(pipeline.part_slices(slice(0, 10_000), 10_000)) == 3
    parts, sent_parts, rings = reduce_everywhere(
        tmp_path / "parts", xs, weights, rounds=3, compression=compression
    )
    assert all(rings.values())
    for i in range(3):
        assert all(torch.equal(parts[r][i], parts["a"][i]) for r in regions)
    if compression == "none":  # each element is summed in the same order: the very same bits
        assert all(torch.equal(parts["a"][i], whole["a"][i]) for i in range(3))
    else:  # int8 scales per part: as close to the truth as whole chunks are, not equal to them
        want = sum(weights[r] * xs[r] for r in regions) / sum(weights.values())
        err = [float((out["a"][0] - want).abs().max()) for out in (whole, parts)]
        assert 0 < err[1] < 2 * err[0], err
    # Each extra part carries its own header and ack: under 256 bytes each (3 rounds of 4 hops of
    # 2 extra parts), no more.
    for r in regions:
        assert sent_whole[r] < sent_parts[r] < sent_whole[r] + 3 * 4 * 2 * 256, (
            r,
            sent_whole[r],
            sent_parts[r],
        )


def test_compressed_ring_keeps_every_region_on_the_same_bits_and_feeds_errors_back(tmp_path: Path) -> None:
    regions = ["a", "b", "c"]
    gen = torch.Generator().manual_seed(1)
    xs = {r: torch.randn(20_000, generator=gen) for r in regions}
    weights = dict.fromkeys(regions, 1.0)
    out, sent, _ = reduce_everywhere(tmp_path, xs, weights, rounds=8, compression="int8")
    want = sum(xs.values()) / 3
    for i in range(8):
        assert all(torch.equal(out[r][i], out["a"][i]) for r in regions)
    one = (out["a"][0] - want).abs().max()
    assert 0 < one < 0.05  # int8 is lossy...
    # ...but what one round drops is sent in the next: the running mean converges on the truth.
    mean8 = torch.stack(out["a"]).mean(0)
    assert (mean8 - want).abs().max() < one / 3
    assert sent["a"] < 8 * 2 * (2 / 3) * 20_000 * 1.05  # 8 rounds, about one byte an element per hop


def test_a_contribution_that_comes_after_its_receiver_has_the_result_is_not_awaited(tmp_path: Path) -> None:
    # A ring one region completed while another saw it break (their peer killed between acking
    # its last hop and sending its own): the one that broke falls back to all-to-all, and the one
    # that completed will never send it a contribution on the plain stream. Here b has reduced
    # round 4 without a (a dropped in its view); a, which still counts b, then reduces round 4:
    # b answers that it has its result, and a goes on without b's contribution rather than waiting
    # out the round's timeout for it (b stays live; the anchors' fingerprints repair the rest).
    regions = ["a", "b"]
    cfg = {"peers": dict.fromkeys(regions, ""), "rendezvous_dir": str(tmp_path), "timeout_s": 120}
    engines = {
        r: create_engine(SyncConfig(mode="local_sgd", land_on_arrival=False, **cfg), region=r, total_steps=10)
        for r in regions
    }
    got: dict[str, Reduced] = {}
    try:
        a, b = (engines[r].strategy.reducers[0] for r in regions)  # type: ignore[union-attr]
        engines["b"].node.mark_dead("a", "lost")  # type: ignore[union-attr]
        assert b.reduce(4, torch.ones(4), 1.0, "fb", 1, 120.0).members == ["b"]
        x = torch.full((4,), 3.0)
        t = threading.Thread(target=lambda: got.update(a=a.reduce(4, x, 1.0, "fa", 1, 120.0)), daemon=True)
        t.start()
        t.join(60)
        assert not t.is_alive(), "a waited for the contribution of b, which had its result"
        assert got["a"].members == ["a"] and torch.equal(got["a"].avg, x)
        assert engines["a"].node.is_alive("b")  # type: ignore[union-attr]
        assert ("anchored0", 4) not in engines["b"].node.inbox  # type: ignore[union-attr]
    finally:
        for e in engines.values():
            e.node.close()  # type: ignore[union-attr]
