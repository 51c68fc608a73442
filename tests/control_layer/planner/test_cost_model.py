"""The cost model's formulas, checked against hand arithmetic and their stated properties."""

from __future__ import annotations

import math

import numpy as np
import pytest

from contracts.job_spec import JobSpec, SyncSpec
from control_layer.planner import cost_model as cm
from control_layer.planner.plan_types import Calibration
from control_layer.planner.sync_settings import CODEC_BYTES

INT8 = CODEC_BYTES["int8"]  # Huffman-coded int8, as priced


def _sync(**kw) -> SyncSpec:
    """A sync section with every setting concrete, as the planner hands it to the cost model."""
    return SyncSpec(**({"every": 100, "compression": "none"} | kw))


def test_auto_settings_are_never_priced_as_a_default() -> None:
    with pytest.raises(ValueError, match="sync.compression is 'auto'"):
        cm.sync_bytes_per_param(SyncSpec(mode="diloco", every=10))
    with pytest.raises(ValueError, match="sync.every is 'auto'"):
        cm.sync_every(SyncSpec(mode="diloco", compression="int8"))
    assert cm.sync_every(SyncSpec(mode="sync", compression="none")) == 1  # sync ignores H


def _spec(**training) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "t",
            "model": {"n_layers": 12, "d_model": 768, "n_heads": 12, "vocab": 50304, "seq_len": 1024},
            "training": {"steps": 100, "global_batch_tokens": 1024 * 64, "precision": "bf16", **training},
        }
    )


def test_flops_per_token_is_6n_plus_attention() -> None:
    spec = _spec()
    m = spec.model
    # N counts the parameters in a matmul: the built model's, less the token and position tables.
    n = m.n_params - 50304 * 768 - 1024 * 768
    assert cm.matmul_params(m) == n
    assert cm.flops_per_token(m, False) == 6 * n + 12 * 12 * 1024 * 768
    assert cm.flops_per_token(m, True) == 8 * n + 16 * 12 * 1024 * 768


def test_stage_params_follow_the_workers_split() -> None:
    m = _spec().model
    block = cm.block_params(m)
    embed, head = (50304 + 1024) * 768, 768 * 50304 + 2 * 768
    assert m.n_params == 12 * block + embed + head
    assert cm.stage_params(m, 1, 1) == m.n_params
    # 12 layers over 5 stages: the first takes 3 (and the embeddings), the last 2 (and the head).
    assert cm.stage_params(m, 1, 5) == max(3 * block + embed, 2 * block + head)
    # TP splits the blocks' linear layers only (q/k/v/fc by columns with their biases, the output
    # projections by rows, their biases whole); norms, embeddings and the head stay whole.
    d = 768
    half_block = 12 * d * d // 2 + 7 * d // 2 + (2 + 4) * d
    assert cm.stage_params(m, 2, 4) == max(3 * half_block + embed, 3 * half_block + head)


def test_precision_changes_rate_and_activations_not_state() -> None:
    assert cm.precision_rate("cuda", "bf16") == cm.precision_rate("cpu", "fp32") == 1.0
    assert cm.precision_rate("cpu", "bf16") == pytest.approx(1 / 8)
    assert cm.precision_rate("cuda", "fp32") < 1.0
    with pytest.raises(ValueError):
        cm.precision_rate("cuda", "auto")
    bf16 = cm.memory_per_device(_spec(), 1, 1, 0, 1, 1, "1f1b")
    fp32 = cm.memory_per_device(_spec(precision="fp32"), 1, 1, 0, 1, 1, "1f1b")
    assert bf16.weights + bf16.grads + bf16.optimizer == fp32.weights + fp32.grads + fp32.optimizer
    # The loss runs in fp32 either way; autocast halves the matmuls' activations but keeps a bf16
    # copy of every weight they read.
    assert bf16.logits == fp32.logits and bf16.activations != fp32.activations
    # The gradient all-reduce moves the fp32 gradients either way.
    args = (100e12, 1e10, 1e-5, 1e10, 1e-5)
    a = cm.replica_time(_spec(), 1, 1, 0, 1, 2, *args).dp_comm
    b = cm.replica_time(_spec(precision="fp32"), 1, 1, 0, 1, 2, *args).dp_comm
    # A ring of two: each sends half the gradients twice (reduce-scatter, all-gather), 2 hops.
    assert a == b == pytest.approx(4 * cm.stage_params(_spec().model, 1, 1) / 1e10 + 2e-5)
    four = cm.replica_time(_spec(), 1, 1, 0, 1, 4, *args).dp_comm
    assert four == pytest.approx(1.5 * 4 * cm.stage_params(_spec().model, 1, 1) / 1e10 + 6e-5)


def test_memory_shrinks_with_zero_stage_and_sharding() -> None:
    spec = _spec()
    stages = [cm.memory_per_device(spec, 1, 1, z, 8, 1, "1f1b").total for z in range(4)]
    assert stages == sorted(stages, reverse=True) and stages[0] > stages[3]
    alone = cm.memory_per_device(spec, 1, 1, 3, 1, 1, "1f1b")
    shared = cm.memory_per_device(spec, 1, 1, 3, 8, 1, "1f1b")
    # The moments shard 8 ways; each parameter's AdamW step counter (4 bytes) stays whole.
    counters = (8 * shared.optimizer - alone.optimizer) / 7
    assert counters / 4 == pytest.approx(round(counters / 4)) and 0 < counters < 1e-5 * alone.optimizer
    # fp32 weights, gradients and Adam moments under autocast: 16 bytes per parameter (4 + 4 + 8).
    z0 = cm.memory_per_device(spec, 1, 1, 0, 1, 1, "1f1b")
    p = cm.stage_params(spec.model, 1, 1)
    assert z0.weights + z0.grads + z0.optimizer == pytest.approx(16 * p)


def test_gpipe_holds_more_activations_than_1f1b() -> None:
    spec = _spec()

    def acts(n_micro: int, schedule: str) -> float:
        return cm.memory_per_device(spec, 1, 4, 0, 1, n_micro, schedule).activations

    # GPipe runs every forward before a backward: each micro-batch more is held at once (less
    # its two token-id tensors, which every micro-batch adds either way).
    ids = 2 * 8 * 1024
    assert acts(16, "gpipe") - acts(8, "gpipe") == pytest.approx(2 * (acts(8, "gpipe") - acts(4, "gpipe")))
    # 1F1B holds at most pp micro-batches on a stage, however many there are.
    assert acts(16, "1f1b") - acts(8, "1f1b") == pytest.approx(8 * ids)
    assert acts(16, "gpipe") > acts(16, "1f1b")


def test_checkpointing_trades_memory_for_flops() -> None:
    plain, ckpt = _spec(), _spec(activation_checkpointing=True)
    assert (
        cm.memory_per_device(ckpt, 1, 1, 0, 1, 1, "1f1b").activations
        < cm.memory_per_device(plain, 1, 1, 0, 1, 1, "1f1b").activations
    )


def test_ring_allreduce() -> None:
    assert cm.allreduce_s(1, 1e9, 1e9, 0.001) == 0.0
    assert cm.allreduce_s(2, 1e9, 1e9, 0.001) == pytest.approx(1.0 + 0.002)
    assert cm.allreduce_s(4, 1e9, 1e9, 0.0) == pytest.approx(1.5)


def test_stage_flops_put_the_head_on_the_last_stage() -> None:
    m = _spec().model
    block = 6 * cm.block_params(m) + 12 * 1024 * 768  # per layer and token
    head = 6 * (768 * 50304 + 2 * 768)  # never recomputed, whole on every tp rank
    assert cm.stage_flops_per_token(m, False, 1, 1) == pytest.approx((12 * block + head,) * 2)
    # 12 layers on 5 stages: 3, 3, 2, 2, 2 (earlier stages take the remainder); the head on the last
    busiest, summed = cm.stage_flops_per_token(m, False, 2, 5)
    assert busiest == pytest.approx(2 * block / 2 + head)
    assert summed == pytest.approx(12 * block / 2 + head)
    ckpt = 8 * cm.block_params(m) + 16 * 1024 * 768
    assert cm.stage_flops_per_token(m, True, 1, 1)[0] == pytest.approx(12 * ckpt + head)
    # Summed over stages on one tp rank: flops_per_token, but for the head's skipped recompute.
    assert cm.stage_flops_per_token(m, False, 1, 4)[1] == pytest.approx(cm.flops_per_token(m, False))


def test_replica_time_parts() -> None:
    spec = _spec()
    flops = 100e12
    one = cm.replica_time(spec, 1, 1, 0, 4, 1, flops, 1e10, 1e-5, 1e10, 1e-5)
    t_mb = cm.flops_per_token(spec.model, False) * 1024 / flops
    assert one.compute == pytest.approx(4 * t_mb)
    assert one.tp_comm == one.dp_comm == one.pp_bubble == one.pp_comm == 0
    pipe = cm.replica_time(spec, 1, 4, 0, 4, 1, flops, 1e10, 1e-5, 1e10, 1e-5)
    # 3 layers per stage, the head on the last: it paces the pipeline; the bubble is the others.
    block = (6 * cm.block_params(spec.model) + 12 * 1024 * 768) * 1024 / flops
    head = 6 * (768 * 50304 + 2 * 768) * 1024 / flops
    assert pipe.compute == pytest.approx(4 * (3 * block + head))
    assert pipe.pp_bubble == pytest.approx(3 * 3 * block)
    assert pipe.pp_comm > 0
    shared = cm.replica_time(spec, 2, 1, 0, 4, 2, flops, 1e10, 1e-5, 1e10, 1e-5)
    assert shared.tp_comm > 0 and shared.dp_comm > 0
    parts = shared.compute + shared.tp_comm + shared.dp_comm + shared.pp_bubble + shared.pp_comm
    assert shared.total == pytest.approx(parts)
    z3 = cm.replica_time(spec, 2, 1, 3, 4, 2, flops, 1e10, 1e-5, 1e10, 1e-5)
    assert z3.dp_comm == pytest.approx(1.5 * shared.dp_comm)


def test_step_time_is_affine_in_micro_batches() -> None:
    spec = _spec()
    args = (100e12, 1e10, 1e-5, 1e9, 1e-4)
    t = [float(cm.replica_time(spec, 2, 4, 0, m, 2, *args).total) for m in (1, 2, 5)]
    assert t[2] - t[1] == pytest.approx(3 * (t[1] - t[0]))


@pytest.mark.parametrize(
    ("sync", "regions", "bytes_per_leader", "hops"),
    [
        (_sync(mode="sync"), 1, 0.0, 0.0),
        (_sync(mode="sync"), 2, 4.0, 2.0),
        # Every call of the exchange waits a round trip: a ring of R makes 2(R−1) calls in turn.
        (_sync(mode="diloco", compression="int8"), 4, 2 * 3 / 4 * INT8, 12.0),
        # Top-k stays top-k on the ring (every hop re-encodes its chunk): 2(R−1)/R payloads.
        (_sync(mode="local_sgd", compression="topk", topk_ratio=0.5), 3, 2 * 2 / 3 * 4.0, 8.0),
        (_sync(mode="gossip", gossip_peers=2), 5, 2 * 4.0, 2.0),
        # ssp pushes its update to every peer at once: R−1 payloads, one call.
        (_sync(mode="ssp", compression="bf16"), 4, 3 * 2.0, 2.0),
        # async: the R−1 others send an update (int8) and get the parameters back (bf16 when
        # compressed, fp32 otherwise), averaged over the R participants.
        (_sync(mode="async", compression="int8"), 3, 2 / 3 * (INT8 + 2.0), 2.0),
        (_sync(mode="async"), 2, 1 / 2 * (4.0 + 4.0), 2.0),
    ],
)
def test_wan_bytes_and_hops(sync: SyncSpec, regions: int, bytes_per_leader: float, hops: float) -> None:
    assert float(cm.wan_bytes_per_leader(sync, 1.0, regions)) == pytest.approx(bytes_per_leader)
    assert float(cm.wan_latency_hops(sync, regions)) == pytest.approx(hops)


def test_exchange_time_factor_follows_the_runtime() -> None:
    # The async server's port takes the R−1 updates in, then sends the R−1 answers out.
    assert float(cm.wan_time_factor(_sync(mode="async"), 1.0, 3)) == pytest.approx(2 * 8.0)
    # ssp's pushes leave the sender's port together; the ring sends 2(R−1)/R.
    assert float(cm.wan_time_factor(_sync(mode="ssp"), 1.0, 3)) == pytest.approx(2 * 4.0)
    assert float(cm.wan_time_factor(_sync(mode="sync"), 1.0, 3)) == pytest.approx(4 / 3 * 4.0)


def test_sync_modes_amortise_and_overlap() -> None:
    assert cm.wan_sync_per_step(_sync(mode="sync"), 100, 2.0, 1.0) == pytest.approx(2.0)
    assert cm.wan_sync_per_step(_sync(mode="local_sgd", every=10), 100, 2.0, 1.0) == pytest.approx(0.2)
    # DiLoCo blocks as the control plane configures it (no sync.overlap): every H-th step waits.
    assert cm.wan_sync_per_step(_sync(mode="diloco", every=10), 100, 2.0, 1.0) == pytest.approx(0.2)
    assert not cm.sync_overlapped(_sync(mode="diloco", every=10))
    assert cm.wan_sync_per_step(_sync(mode="async", every=1), 100, 2.0, 1.0) == pytest.approx(1.0)
    assert cm.wan_sync_per_step(_sync(mode="ssp", every=1, staleness=0), 100, 2.0, 1.0) == pytest.approx(2.0)
    assert cm.wan_sync_per_step(_sync(mode="ssp", every=1, staleness=2), 100, 2.0, 1.0) == pytest.approx(1.0)
    # ssp and async send their update once a round of H steps, as the runtime's strategies do.
    assert cm.wan_sync_per_step(_sync(mode="ssp", every=10, staleness=0), 100, 2.0, 1.0) == pytest.approx(0.2)
    assert cm.exchanges_per_step(_sync(mode="async", every=10), 100) == pytest.approx(0.1)
    # The last round of ceil(T/H) still happens: 95 steps, H=10 -> 10 exchanges.
    assert cm.exchanges_per_step(_sync(mode="diloco", every=10), 95) == pytest.approx(10 / 95)


def test_calibration_lookups() -> None:
    cal = Calibration(device_efficiency={"NVIDIA H100": 0.7}, link_goodput={"eu|us": 0.4})
    assert cm.device_efficiency("nvidia h100", cal) == 0.7
    assert cm.device_efficiency("cpu", cal) == cm.DEFAULT_DEVICE_EFFICIENCY
    assert cm.link_goodput("us", "eu", cal) == 0.4
    assert cm.link_goodput("eu", "eu", None) == cm.DEFAULT_LAN_GOODPUT
    assert cm.link_goodput("eu", "ap", None) == cm.DEFAULT_WAN_GOODPUT
    with pytest.raises(ValueError):
        Calibration(device_efficiency={"x": 0.0})


def test_vectorised_over_clusters() -> None:
    spec = _spec()
    flops = np.array([100e12, 200e12])
    rt = cm.replica_time(spec, 1, 1, 0, 2, 1, flops, 1e10, 1e-5, 1e10, 1e-5)
    assert rt.total.shape == (2,) and math.isclose(rt.total[0], 2 * rt.total[1])
