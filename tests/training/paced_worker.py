"""``training.worker`` with a region made slower on purpose: ``CPN_TEST_STEP_SLEEP_S`` seconds of
sleep in every train step (as a slower GPU would add), and each step's wall-clock end and rounds
opened in its metrics, so a test can see when every region reached each round's end."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from training import runtime, worker

SLEEP_S = float(os.environ.get("CPN_TEST_STEP_SLEEP_S", "0") or 0)
_train_step = runtime.Trainer.train_step


def paced_train_step(self: runtime.Trainer) -> dict[str, Any]:
    if SLEEP_S > 0:
        time.sleep(SLEEP_S)
    m = _train_step(self)
    m["t_end"] = time.time()
    strategy = getattr(self.sync, "strategy", None)
    if strategy is not None:
        m["rounds_opened"] = strategy.progress()[0]
    return m


runtime.Trainer.train_step = paced_train_step  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(worker.main())
