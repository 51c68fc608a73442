"""Every number in a job spec is bounded and every float finite: the spec is refused at the edge,
naming the field, instead of failing later in a worker, the planner or the database."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from contracts.errors import InvalidArgument
from contracts.job_spec import JobSpec

BASE: dict[str, Any] = {
    "name": "bounds",
    "model": {"n_layers": 2, "d_model": 32, "n_heads": 4, "vocab": 64, "seq_len": 16},
    "training": {"steps": 10, "global_batch_tokens": 64},
}

CASES = [
    ("data.seed", 2**70),
    ("data.seed", -1),
    ("training.seed", 2**63),
    ("training.lr", float("inf")),
    ("training.lr", 1e308),
    ("training.lr", float("nan")),
    ("training.steps", 10**12),
    ("training.weight_decay", float("inf")),
    ("training.grad_clip", 1e300),
    ("sync.every", 10**18),
    ("sync.outer_lr", float("inf")),
    ("sync.staleness", 10**9),
    ("qos.max_hours", float("inf")),
    ("qos.max_cost", float("nan")),
    ("qos.min_gpu_mem_gb", 1e300),
    ("model.vocab", 1 << 30),
    ("model.seq_len", 1 << 30),
    ("parallelism.dp", 1 << 40),
]


def _with(path: str, value: Any) -> dict[str, Any]:
    spec = copy.deepcopy(BASE)
    *parents, leaf = path.split(".")
    node = spec
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value
    return spec


@pytest.mark.parametrize(("path", "value"), CASES)
def test_out_of_bounds_numbers_are_refused_naming_the_field(path: str, value: Any) -> None:
    # through the text parser, as the CLI reads a file (non-finite floats as JSON tokens)
    text = json.dumps(_with(path, value), allow_nan=True)
    with pytest.raises(InvalidArgument) as err:
        JobSpec.from_yaml_or_json(text)
    assert [e["field"] for e in err.value.details["errors"]] == [path], err.value.message


def test_a_spec_at_the_edges_of_the_bounds_is_accepted() -> None:
    spec = _with("training.seed", 2**63 - 1)
    spec["data"] = {"seed": 2**63 - 1}
    spec["sync"] = {"every": 1_000_000, "outer_lr": 10.0}
    assert JobSpec.model_validate(spec).training.seed == 2**63 - 1
