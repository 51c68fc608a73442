"""A worker with a test engine on the cross-region hook: at step ``AT`` the leader records the
gathered replica and overwrites it with another model's weights; the runtime must scatter that into
every shard. Run under torchrun's env; argv: the config path (outputs go beside it)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from contracts.worker_config import load_worker_config
from training.models.gpt import GPT
from training.parallel.init import compute_cleanup, compute_init
from training.runtime import build_trainer

AT = 2
REPLACEMENT_SEED = 99


class ReplaceAt:
    def __init__(self, out: Path, replacement: list[Tensor], is_leader: bool) -> None:
        self.out, self.replacement, self.is_leader = out, replacement, is_leader
        self.calls: list[tuple[int, int]] = []

    def should_sync(self, step: int) -> bool:
        return step == AT

    def syncs_gradients(self, step: int) -> bool:
        return False

    def reduce_gradients(self, step: int, grads: list[Tensor]) -> None:
        raise AssertionError("not called: syncs_gradients is False")

    def after_step(self, step: int, model_params: list[Tensor]) -> None:
        self.calls.append((step, len(model_params)))
        if self.is_leader:
            torch.save([t.clone() for t in model_params], self.out / "gathered.pt")
            for t, new in zip(model_params, self.replacement, strict=True):
                t.copy_(new)

    def metrics(self) -> dict[str, Any]:
        return {"bytes_sent": {"peer": 1}} if self.calls else {}

    def state_dict(self) -> dict[str, Any]:
        return {"rounds": len(self.calls), "last": torch.tensor(self.calls[-1][0] if self.calls else -1)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass

    def totals(self) -> dict[str, int]:
        return {}

    def local_steps(self, planned: int) -> int:
        return planned

    def job_step(self, step: int) -> float:
        return float(step)


def main() -> None:
    cfg = load_worker_config(sys.argv[1])
    out = Path(sys.argv[1]).parent
    ctx = compute_init(cfg.device)
    trainer = build_trainer(cfg, ctx)
    assert cfg.model is not None
    replacement = [p.detach().clone() for p in GPT(cfg.model, seed=REPLACEMENT_SEED).parameters()]
    sync = ReplaceAt(out, replacement, ctx.is_leader)
    trainer.sync = sync
    metrics: list[dict[str, Any]] = []
    result = trainer.run(metrics.append)
    (out / f"rank{ctx.rank}.json").write_text(
        json.dumps({"result": result, "calls": sync.calls, "metrics": metrics})
    )
    compute_cleanup()


if __name__ == "__main__":
    main()
