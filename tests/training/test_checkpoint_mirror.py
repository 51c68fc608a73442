"""A checkpoint of a group spanning nodes is whole on every node: two ranks standing for two nodes,
each writing to a directory of its own (no shared disk), FSDP-sharded so each writes a shard the
other lacks. After the save both directories hold every file, marked complete; with one node's
directory gone, a new node holding a copy of the survivor's resumes the state exactly, under
either rank; ranks agree on no checkpoint when one of them holds none, unless they know their
nodes: then the node holding it sends it to the one lacking it (its fetch failed, or brought a step
the survivor had pruned), whatever half-written files were there, and both resume it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from training.checkpoint import BackgroundSaver, agreed_checkpoint, load_checkpoint

STEP = 5


def _sharded_model() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))
    fully_shard(model, mesh=init_device_mesh("cpu", (2,)))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _full(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.full_tensor() for k, v in model.state_dict().items()}  # collective


def _init(rank: int, tmp: Path, name: str) -> None:
    os.environ["GROUP_RANK"] = str(rank)  # torchrun's node rank: each rank its own node here
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp / name), 2), rank=rank, world_size=2)


def _save(rank: int, tmp: Path) -> None:
    _init(rank, tmp, "store-save")
    try:
        model, opt = _sharded_model()
        model(torch.randn(8, 16)).square().mean().backward()
        opt.step()
        saver = BackgroundSaver(keep_last=2, spans_nodes=True)
        saver.save(tmp / f"node{rank}", STEP, model, opt, {"scheduler": {"at": STEP}})
        assert saver.wait() == STEP
        want = _full(model)
        if rank == 0:
            torch.save(want, tmp / "want.pt")
        saver.close()
    finally:
        dist.destroy_process_group()


def _resume(rank: int, tmp: Path, dirs: list[str], empty: str) -> None:
    _init(rank, tmp, "store-resume")
    try:
        # One rank without any checkpoint: nobody resumes (a group starts from one state).
        assert agreed_checkpoint(tmp / (empty if rank == 1 else dirs[0])) is None
        path = agreed_checkpoint(tmp / dirs[rank])
        assert path is not None and path.name == f"step_{STEP:08d}"
        model, opt = _sharded_model()
        meta = load_checkpoint(path, model, opt)
        assert meta["step"] == STEP and meta["scheduler"] == {"at": STEP}
        got, want = _full(model), torch.load(tmp / "want.pt")
        assert all(torch.equal(got[k], want[k]) for k in want)
    finally:
        dist.destroy_process_group()


def _share(rank: int, tmp: Path, dirs: list[str]) -> None:
    _init(rank, tmp, "store-share")
    try:
        layout = BackgroundSaver(keep_last=2, spans_nodes=True).layout
        assert layout is not None
        path = agreed_checkpoint(tmp / dirs[rank], layout=layout)
        assert path is not None and path == tmp / dirs[rank] / f"step_{STEP:08d}"
        model, opt = _sharded_model()
        assert load_checkpoint(path, model, opt)["step"] == STEP
        got, want = _full(model), torch.load(tmp / "want.pt")
        assert all(torch.equal(got[k], want[k]) for k in want)
    finally:
        dist.destroy_process_group()


def test_every_node_holds_the_whole_checkpoint_and_a_new_node_resumes_from_a_copy(tmp_path: Path) -> None:
    mp.start_processes(_save, args=(tmp_path,), nprocs=2, start_method="spawn")
    steps = [tmp_path / f"node{r}" / f"step_{STEP:08d}" for r in (0, 1)]
    listings = [sorted(p.name for p in d.iterdir()) for d in steps]
    assert listings[0] == listings[1]
    names = set(listings[0])
    assert {"COMPLETE", ".metadata", "meta.pt", "__0_0.distcp", "__1_0.distcp"} <= names, names
    assert not any(n.endswith(".mirror-part") for n in names)
    for name in names:  # the same bytes on both nodes
        assert (steps[0] / name).read_bytes() == (steps[1] / name).read_bytes(), name

    # Node 0 is lost; a new node got a copy of node 1's directory (as an agent's fetch brings it)
    # and takes rank 0, the survivor rank 1.
    shutil.copytree(tmp_path / "node1", tmp_path / "node2")
    shutil.rmtree(tmp_path / "node0")
    (tmp_path / "empty").mkdir()
    mp.start_processes(_resume, args=(tmp_path, ["node2", "node1"], "empty"), nprocs=2, start_method="spawn")

    # A new node that got no copy (and holds a half-written directory of that step): the survivor
    # sends it the checkpoint when the group starts, and both resume from it.
    stale = tmp_path / "node3" / f"step_{STEP:08d}"
    stale.mkdir(parents=True)
    (stale / "__0_0.distcp").write_bytes(b"torn")
    mp.start_processes(_share, args=(tmp_path, ["node1", "node3"]), nprocs=2, start_method="spawn")
    got = stale.parent / f"step_{STEP:08d}"
    assert sorted(p.name for p in got.iterdir()) == listings[1]
    for name in names:
        assert (got / name).read_bytes() == (steps[1] / name).read_bytes(), name
