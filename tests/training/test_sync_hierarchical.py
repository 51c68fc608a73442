"""The hierarchical dense exchange over real gRPC: members reduce to their region's head, the heads
ring, the heads hand the result back; every participant ends on the same bits, the weighted mean
of all contributions, and the heads' WAN link carries 2(G-1)/G of the payload for G regions."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from contracts.sync_config import SyncConfig
from training.sync.engine import create_engine
from training.sync.stages import stage_sync_config

N = 30_000


def run(
    tmp: Path,
    xs: dict[str, torch.Tensor],
    weights: dict[str, float],
    hierarchy: dict[str, list[str]],
    rounds: int = 1,
    absent: tuple[str, ...] = (),
    **sync: object,
) -> tuple[dict[str, list[torch.Tensor]], dict[str, dict[str, int]], dict[str, list[set[str]]]]:
    """Each participant's averages per round, bytes sent per peer, and who took part per round.
    ``absent`` participants start their engine (so they are known) and close it at once."""
    names = sorted(xs)
    cfg = {"peers": dict.fromkeys(names, ""), "rendezvous_dir": str(tmp), "timeout_s": 10} | sync
    engines = {
        r: create_engine(
            SyncConfig(mode="local_sgd", hierarchy=hierarchy, land_on_arrival=False, **cfg),
            region=r,
            total_steps=10,
            weight=weights[r],
        )
        for r in names
    }
    for r in absent:
        engines[r].node.close()
    live = [r for r in names if r not in absent]
    out: dict[str, list[torch.Tensor]] = {r: [] for r in live}
    members: dict[str, list[set[str]]] = {r: [] for r in live}
    seen: dict[str, list[tuple[dict[str, str], dict[str, tuple[float, float]]]]] = {r: [] for r in live}

    def figures(r: str, i: int) -> tuple[float, float]:
        return 1000.0 + i + names.index(r) / 3, 0.1 * (names.index(r) + 1)

    def go(r: str) -> None:
        red = engines[r].strategy.reducers[0]
        for i in range(rounds):
            res = red.reduce(i, xs[r], weights[r], f"fp{r}", 1, 10.0, figures=figures(r, i))
            out[r].append(res.avg)
            members[r].append(set(res.fingerprints))
            seen[r].append((res.fingerprints, res.figures))

    try:
        threads = [threading.Thread(target=go, args=(r,)) for r in live]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads), "an exchange hung"
        # Every contribution's fingerprint and balancing figures reach every participant.
        for r in live:
            assert len(seen[r]) == rounds
            for i, (fps, figs) in enumerate(seen[r]):
                assert fps == {p: f"fp{p}" for p in fps}
                assert figs == {p: figures(p, i) for p in fps}
        sent = {r: engines[r].node.stats.take()["bytes_sent"] for r in live}
    finally:
        for r in live:
            engines[r].node.close()
    return out, sent, members


def data(names: list[str], seed: int) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    gen = torch.Generator().manual_seed(seed)
    return {r: torch.randn(N, generator=gen) for r in names}, {r: float(i + 1) for i, r in enumerate(names)}


@pytest.mark.parametrize(
    "hierarchy",
    [
        {"eu": ["eu-a", "eu-b"], "us": ["us-a", "us-b"]},
        {"us": ["us-b", "us-a"], "eu": ["eu-a"], "ap": ["ap-a"]},
        {"eu": ["eu-a", "eu-b", "us-a", "us-b"]},
    ],
)
def test_every_participant_gets_the_weighted_mean_on_the_same_bits(
    tmp_path: Path, hierarchy: dict[str, list[str]]
) -> None:
    names = sorted(p for g in hierarchy.values() for p in g)
    xs, weights = data(names, 0)
    out, sent, members = run(tmp_path, xs, weights, hierarchy)
    want = sum(weights[r] * xs[r] for r in names) / sum(weights.values())
    first = out[names[0]][0]
    assert all(torch.equal(out[r][0], first) for r in names)
    assert torch.allclose(first, want, atol=1e-5)
    assert all(m[0] == set(names) for m in members.values())
    payload = 4 * N
    heads = [g[0] for g in hierarchy.values()]
    g = len(heads)
    for region, group in hierarchy.items():
        head = group[0]
        for m in group[1:]:  # a member sends its contribution to its head once, and nothing else
            assert set(sent[m]) == {head} and payload <= sent[m][head] <= payload * 1.05
            assert payload <= sent[head][m] <= payload * 1.05  # the averaged chunks back
        wan = sum(n for p, n in sent[head].items() if p in heads)
        assert 2 * (g - 1) / g * payload <= wan <= 2 * (g - 1) / g * payload * 1.05 + 1, (region, wan)


def test_compressed_hierarchy_keeps_one_result_and_feeds_errors_back(tmp_path: Path) -> None:
    hierarchy = {"eu": ["eu-a", "eu-b"], "us": ["us-a"]}
    names = sorted(p for g in hierarchy.values() for p in g)
    xs, _ = data(names, 1)
    weights = dict.fromkeys(names, 1.0)
    out, _, _ = run(tmp_path, xs, weights, hierarchy, rounds=8, compression="int8")
    want = sum(xs.values()) / 3
    for i in range(8):
        assert all(torch.equal(out[r][i], out[names[0]][i]) for r in names)
    one = (out[names[0]][0] - want).abs().max()
    assert 0 < one < 0.05
    mean8 = torch.stack(out[names[0]]).mean(0)
    assert (mean8 - want).abs().max() < one / 3


@pytest.mark.parametrize("absent", ["eu-b", "us-a"])
def test_a_lost_participant_breaks_no_round(tmp_path: Path, absent: str) -> None:
    """A member or a head gone: the round falls back to all-to-all over the live participants,
    and the next round, short of a configured participant, runs the flat ring."""
    hierarchy = {"eu": ["eu-a", "eu-b"], "us": ["us-a", "us-b"]}
    names = sorted(p for g in hierarchy.values() for p in g)
    xs, weights = data(names, 2)
    t0 = time.monotonic()
    out, _, members = run(tmp_path, xs, weights, hierarchy, rounds=2, absent=(absent,))
    assert time.monotonic() - t0 < 30
    live = [r for r in names if r != absent]
    want = sum(weights[r] * xs[r] for r in live) / sum(weights[r] for r in live)
    for i in range(2):
        assert all(members[r][i] == set(live) for r in live)
        assert all(torch.allclose(out[r][i], want, atol=1e-5) for r in live)
        assert all(torch.equal(out[r][i], out[live[0]][i]) for r in live)


def test_config_refuses_a_hierarchy_that_misses_or_repeats_a_participant() -> None:
    peers = {"us-a": "", "us-b": ""}
    ok = SyncConfig(
        mode="sync", region="eu-a", peers=peers, hierarchy={"eu": ["eu-a"], "us": ["us-a", "us-b"]}
    )
    assert list(ok.hierarchy) == ["eu", "us"]
    for bad in ({"eu": ["eu-a"], "us": ["us-a"]}, {"eu": ["eu-a", "us-a"], "us": ["us-a", "us-b"]}):
        with pytest.raises(ValueError, match="once"):
            SyncConfig(mode="sync", region="eu-a", peers=peers, hierarchy=bad)
    with pytest.raises(ValueError, match="modes"):
        SyncConfig(mode="ssp", region="eu-a", peers=peers, hierarchy={"eu": ["eu-a", "us-a", "us-b"]})


def test_a_stage_ring_carries_its_own_hierarchy_to_its_engine() -> None:
    peers = {"eu-b": "10.0.0.2:1", "us-a": "10.0.0.3:1"}
    ring = {"stage": 0, "listen": "127.0.0.1:0", "peers": peers}
    hierarchy = {"eu": ["eu-a", "eu-b"], "us": ["us-a"]}
    sync = SyncConfig(
        mode="diloco",
        region="eu-a",
        peers=peers,
        stages=[ring | {"hierarchy": hierarchy}, ring | {"stage": 1}],
    )
    assert stage_sync_config(sync, 0, leads=True).hierarchy == hierarchy
    assert stage_sync_config(sync, 1, leads=True).hierarchy == {}
    with pytest.raises(ValueError, match="once"):
        SyncConfig(mode="diloco", region="eu-a", peers=peers, stages=[ring | {"hierarchy": {"eu": ["eu-a"]}}])
