"""The worker shards by the plan the planner prices by: ``apply_tp`` run for real (one rank of two
over torch's fake process group) leaves each tensor the shape ``contracts.model.tp_local_shape``
says, which is what ``control_layer.planner.memory_params`` counts."""

from __future__ import annotations

import math

import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.testing._internal.distributed.fake_pg import FakeStore

from contracts.model import TP_PLAN, GPTConfig, gpt_param_shapes, tp_local_shape
from control_layer.planner.memory_params import stage_params
from training.models.gpt import GPT
from training.parallel import parallelize
from training.parallel.parallelize import apply_tp


def test_apply_tp_leaves_the_shapes_the_planner_prices() -> None:
    cfg = GPTConfig(n_layers=2, d_model=16, n_heads=4, vocab=40, seq_len=8)
    shapes = gpt_param_shapes(cfg)
    model = GPT(cfg)
    assert list(shapes) == [name for name, _ in model.named_parameters()]
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        apply_tp(model, init_device_mesh("cpu", (2,)))
    finally:
        dist.destroy_process_group()
    held = {}
    for name, p in model.named_parameters():
        local = tuple(p.to_local().shape if isinstance(p, DTensor) else p.shape)
        assert local == tp_local_shape(name, shapes[name], 2), name
        held[name] = math.prod(local)
    # Only the plan's modules are split; embeddings, norms and the head stay whole.
    split = {n for n in shapes if held[n] != math.prod(shapes[n])}
    assert {".".join(n.split(".")[2:-1]) for n in split} <= set(TP_PLAN)
    planned = stage_params(cfg, 2, 1, 1, 0)
    blocks = [sum(v for n, v in held.items() if n.startswith(f"layers.{i}.")) for i in range(2)]
    assert [u.local for u in planned.blocks] == blocks
    assert planned.embed.local + planned.head.local == sum(
        v for n, v in held.items() if not n.startswith("layers.")
    )


def test_the_worker_and_the_planner_read_one_plan() -> None:
    assert parallelize.TP_PLAN is TP_PLAN
