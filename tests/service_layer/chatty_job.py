"""A bring-your-own job that says something on stdout and stderr before training (the linear
regression of ``tests.training.byo_example``): output for the log tests to find."""

from __future__ import annotations

import os
import sys
from typing import Any

from tests.training.byo_example import build as build_regression
from training.byo import BYOJob


def build(cfg: Any) -> BYOJob:
    rank = os.environ.get("RANK", "0")
    print(f"chatty: building the model on rank {rank}", flush=True)
    print(f"chatty: a note on stderr from rank {rank}", file=sys.stderr, flush=True)
    return build_regression(cfg)
