from __future__ import annotations

import pytest

from contracts.errors import InvalidArgument
from contracts.model import GPTConfig
from training.parallel.dims import ParallelDims


def test_world_size_must_equal_the_product_of_degrees() -> None:
    with pytest.raises(InvalidArgument, match=r"world size 3 != dp_local \(2\) x tp \(2\) x pp \(1\) = 4"):
        ParallelDims(dp=2, tp=2, pp=1, world_size=3)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dp": 0, "tp": 1, "pp": 1, "world_size": 0}, "dp must be >= 1"),
        ({"dp": 1, "tp": 1, "pp": 1, "world_size": 1, "zero": 5}, "zero must be 0, 1, 2 or 3"),
        (
            {"dp": 1, "tp": 1, "pp": 2, "world_size": 2, "microbatches": 1},
            r"microbatches \(1\) must be >= pp",
        ),
        ({"dp": 1, "tp": 1, "pp": 1, "world_size": 1, "pp_schedule": "zb"}, "unknown pp_schedule"),
    ],
)
def test_invalid_degrees(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        ParallelDims(**kwargs)  # type: ignore[arg-type]


def test_model_must_split_over_degrees() -> None:
    dims = ParallelDims(dp=1, tp=3, pp=4, world_size=12, microbatches=4)
    with pytest.raises(InvalidArgument, match=r"n_heads \(4\) must be divisible by tp \(3\)"):
        dims.check_model(GPTConfig(n_layers=4, d_model=32, n_heads=4, vocab=8, seq_len=4))
    dims = ParallelDims(dp=1, tp=2, pp=4, world_size=8, microbatches=4)
    with pytest.raises(InvalidArgument, match=r"n_layers \(2\) must be >= pp \(4\)"):
        dims.check_model(GPTConfig(n_layers=2, d_model=32, n_heads=4, vocab=8, seq_len=4))


def test_stage_leaders_and_mesh_required() -> None:
    dims = ParallelDims(dp=2, tp=2, pp=2, world_size=8, zero=3, microbatches=2)
    assert [dims.stage_leader(s) for s in range(2)] == [0, 4]
    with pytest.raises(Exception, match="build_mesh"):
        _ = dims.mesh
