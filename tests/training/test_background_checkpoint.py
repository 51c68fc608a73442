"""Checkpoints written while training goes on: the state saved is the step's (weights and the
optimizer's moments), even though both move on before the write ends; it counts as complete only
once written; older ones are rotated out."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from training.checkpoint import BackgroundSaver, complete_checkpoints, load_checkpoint


def _step(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    model(torch.randn(4, 64)).square().mean().backward()
    opt.step()
    opt.zero_grad()


def test_background_save_keeps_the_steps_state(tmp_path: Path) -> None:
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        saver = BackgroundSaver(keep_last=2)
        root = tmp_path / "ckpt"
        for step in (1, 2, 3):
            _step(model, opt)
            want = {k: v.clone() for k, v in model.state_dict().items()}
            want_moments = [opt.state[p]["exp_avg"].clone() for p in model.parameters()]
            saver.save(root, step, model, opt, {"scheduler": {"at": step}})
            _step(model, opt)  # what the next steps do while the write is in flight
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(1.0)
            assert saver.wait() == step
            assert [s for s, _ in complete_checkpoints(root)] == list(range(max(1, step - 1), step + 1))
            fresh = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))
            fresh_opt = torch.optim.AdamW(fresh.parameters())
            meta = load_checkpoint(root / f"step_{step:08d}", fresh, fresh_opt)
            assert meta["step"] == step and meta["scheduler"] == {"at": step}
            for k, v in fresh.state_dict().items():
                assert torch.equal(v, want[k]), k
            for p, m in zip(fresh.parameters(), want_moments, strict=True):
                assert torch.equal(fresh_opt.state[p]["exp_avg"], m)
        saver.close()
    finally:
        dist.destroy_process_group()
