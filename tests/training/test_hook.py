from __future__ import annotations

from typing import Any

import torch

from contracts.worker_config import parse_worker_config
from training.sync_hook import NoOpSync, build_sync, other_regions
from training.sync_protocol import CrossRegionSync, SyncContext


def ctx() -> SyncContext:
    return SyncContext(
        job_id="j",
        region="eu-west",
        cluster="c",
        is_leader=True,
        rank=0,
        world_size=1,
        local_replicas=1,
        global_replicas=1,
        replica_offset=0,
        param_names=("w",),
        param_shapes=((2,),),
    )


def cfg(sync: dict[str, Any]) -> Any:
    return parse_worker_config(
        {
            "job_id": "j",
            "region": "eu-west",
            "cluster": "c",
            "model": {"n_layers": 1, "d_model": 8, "n_heads": 2, "vocab": 8, "seq_len": 4},
            "training": {"steps": 1, "local_batch": 1},
            "sync": sync,
        }
    )


def test_no_op_is_a_cross_region_sync_that_changes_nothing() -> None:
    sync = NoOpSync()
    assert isinstance(sync, CrossRegionSync)
    params = [torch.ones(2)]
    sync.after_step(1, params)
    assert not sync.should_sync(1) and torch.equal(params[0], torch.ones(2)) and sync.metrics() == {}


def test_single_region_gets_the_no_op() -> None:
    assert isinstance(build_sync(cfg({}), ctx()), NoOpSync)
    only_self = cfg({"mode": "diloco", "every": 2, "peers": {"eu-west": "127.0.0.1:1"}})
    assert other_regions(only_self) == [] and isinstance(build_sync(only_self, ctx()), NoOpSync)
    assert isinstance(build_sync(cfg({"mode": "none", "peers": {"us": "h:1"}}), ctx()), NoOpSync)
