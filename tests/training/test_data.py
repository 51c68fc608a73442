from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from contracts.errors import InvalidArgument, NotFound, PermissionDenied
from contracts.worker_config import DataSpec
from training.byo import DatasetStream
from training.data.markov import MarkovSource
from training.data.streams import build_stream, check_residency
from training.data.tokens import TokenFile, write_token_file


def test_entropy_rate_matches_the_empirical_loss_of_the_true_chain() -> None:
    src = MarkovSource(48, seed=2, branching=4)
    seqs = src.sample(2048, 65, torch.Generator().manual_seed(0)).numpy()
    empirical = -np.log(src.prob(seqs[:, :-1], seqs[:, 1:])).mean()
    assert abs(empirical - src.entropy_rate_nats) < 0.01
    assert src.entropy_rate_nats < math.log(4) < 0.5 * src.uniform_nats  # floor far below uniform


def test_chain_is_stationary_and_sparse() -> None:
    src = MarkovSource(32, seed=1, branching=3)
    assert np.allclose(src.stationary @ src.transition, src.stationary, atol=1e-10)
    assert ((src.transition.toarray() > 0).sum(axis=1) == 3).all()
    first = src.sample(20000, 1, torch.Generator().manual_seed(1))[:, 0].numpy()
    assert np.abs(np.bincount(first, minlength=32) / 20000 - src.stationary).max() < 0.02


def test_a_large_vocabulary_chain_is_sparse_and_stationary() -> None:
    # A GPU node's reference models and a 1B model use vocabularies of 8k-32k tokens (Llama 3:
    # 128k): a dense transition matrix would take 8.6 GB at 32k, and solving it, hours.
    src = MarkovSource(65_536, seed=3)
    assert src.transition.nnz == 65_536 * 4
    assert np.abs(src.stationary @ src.transition - src.stationary).max() < 1e-15
    assert abs(src.stationary.sum() - 1.0) < 1e-12 and (src.stationary > 0).all()
    assert 0 < src.entropy_rate_nats < math.log(4)


def test_sampling_is_reproducible_from_the_generator() -> None:
    src = MarkovSource(32, seed=1)
    a = src.sample(4, 10, torch.Generator().manual_seed(9))
    b = src.sample(4, 10, torch.Generator().manual_seed(9))
    c = src.sample(4, 10, torch.Generator().manual_seed(10))
    assert torch.equal(a, b) and not torch.equal(a, c)
    # every transition is one the chain allows
    assert (src.prob(a[:, :-1].numpy(), a[:, 1:].numpy()) > 0).all()


def test_markov_streams_differ_by_replica_and_repeat_by_step() -> None:
    spec = DataSpec(seed=4)
    s0, s1 = (
        build_stream(spec, worker_region="r", vocab=32, seq_len=8, replica=r, replicas=2) for r in (0, 1)
    )
    x0, y0 = s0.batch(3, 5)
    assert x0.shape == y0.shape == (5, 8)
    assert torch.equal(x0[:, 1:], y0[:, :-1])  # targets are the next tokens
    assert torch.equal(s0.batch(3, 5)[0], x0)
    assert not torch.equal(s1.batch(3, 5)[0], x0)
    assert not torch.equal(s0.batch(4, 5)[0], x0)


@pytest.mark.parametrize("dtype", ["uint16", "uint32"])
def test_token_file_round_trip_and_disjoint_shards(tmp_path: Path, dtype: str) -> None:
    base = 70000 if dtype == "uint32" else 0  # ids beyond uint16 need uint32
    ids = np.arange(1000) + base  # each id names its position
    path = write_token_file(tmp_path / "t.bin", ids, dtype)  # type: ignore[arg-type]
    tf = TokenFile(path, dtype)  # type: ignore[arg-type]
    assert len(tf) == 1000 and torch.equal(tf.window(10, 5), torch.from_numpy(ids[10:15].astype(np.int64)))
    spec = DataSpec(kind="tokens", path=str(path), dtype=dtype)  # type: ignore[arg-type]
    s0, s1 = (
        build_stream(spec, worker_region="r", vocab=base + 1000, seq_len=16, replica=r, replicas=2)
        for r in (0, 1)
    )
    x0, y0 = s0.batch(0, 64)
    x1, y1 = s1.batch(0, 64)
    assert torch.equal(x0[:, 1:], y0[:, :-1]) and torch.equal(y0 - x0, torch.ones_like(x0))
    assert int(y0.max()) - base < 500 <= int(x1.min()) - base  # replica 0 reads [0, 500), replica 1 the rest
    assert int(y1.max()) - base < 1000


def test_token_file_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="not found"):
        TokenFile(tmp_path / "missing.bin")
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x00\x01\x02")
    with pytest.raises(InvalidArgument, match="multiple of 2"):
        TokenFile(odd, "uint16")
    path = write_token_file(tmp_path / "t.bin", np.full(100, 40), "uint16")
    stream = build_stream(
        DataSpec(kind="tokens", path=str(path)), worker_region="r", vocab=32, seq_len=8, replica=0, replicas=1
    )
    with pytest.raises(InvalidArgument, match="model.vocab"):
        stream.batch(0, 2)
    with pytest.raises(InvalidArgument, match="uint16"):
        write_token_file(tmp_path / "u.bin", np.array([70000]), "uint16")


def test_pinned_dataset_is_read_only_in_its_region(tmp_path: Path) -> None:
    spec = DataSpec(kind="tokens", path=str(tmp_path / "never-opened.bin"), region="eu-west")
    with pytest.raises(PermissionDenied, match="pinned to region 'eu-west'") as e:
        build_stream(spec, worker_region="us-east", vocab=32, seq_len=8, replica=0, replicas=1)
    assert e.value.details["field"] == "data.region"
    check_residency(spec, "eu-west")  # its own region may
    check_residency(DataSpec(), "anywhere")  # unpinned data anywhere


def test_byo_dataset_stream_gives_replicas_disjoint_items() -> None:
    data = [(torch.tensor([float(i)]), torch.tensor([float(i)])) for i in range(40)]
    streams = [DatasetStream(data, seed=0, replica=r, replicas=2, batch_size=4) for r in (0, 1)]
    seen: list[set[int]] = [set(), set()]
    for r, s in enumerate(streams):
        for step in range(5):  # one epoch: 20 items per replica, 4 per batch
            x, _ = s.batch(step, 4)
            seen[r] |= {int(v) for v in x.flatten()}
    assert len(seen[0]) == len(seen[1]) == 20 and not seen[0] & seen[1]
    assert torch.equal(streams[0].batch(7, 4)[0], streams[0].batch(7, 4)[0])
