from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from contracts.errors import InvalidArgument
from contracts.worker_config import load_worker_config, parse_worker_config


def raw(**over: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "job_id": "j",
        "region": "eu-west",
        "cluster": "c",
        "model": {"n_layers": 2, "d_model": 32, "n_heads": 4, "vocab": 64, "seq_len": 16},
        "training": {"steps": 10, "global_batch": 8},
    }
    cfg.update(over)
    return cfg


def test_local_batch_derives_from_global_batch_and_replicas() -> None:
    cfg = parse_worker_config(raw(parallel={"dp_local": 2}, sync={"global_replicas": 4, "replica_offset": 2}))
    assert (cfg.local_batch, cfg.global_replicas, cfg.replica_offset, cfg.micro_batch) == (2, 4, 2, 2)


def test_single_cluster_defaults() -> None:
    cfg = parse_worker_config(raw())
    assert cfg.global_replicas == 1 and cfg.sync.mode == "none" and cfg.parallel.zero == 0


@pytest.mark.parametrize(
    ("over", "message", "field"),
    [
        (
            {"training": {"steps": 1, "global_batch": 6}, "parallel": {"dp_local": 4}},
            "divisible by the 4",
            None,
        ),
        ({"training": {"steps": 1}}, "set global_batch or local_batch", None),
        ({"training": {"steps": 0, "local_batch": 2}}, "greater than 0", "training.steps"),
        ({"training": {"steps": 1, "local_batch": 6, "micro_batch": 4}}, "divisible by micro_batch", None),
        ({"parallel": {"pp": 2, "microbatches": 1}}, "microbatches \\(1\\) must be >= pp", None),
        ({"parallel": {"dp_local": 3}, "sync": {"global_replicas": 4, "replica_offset": 2}}, "exceeds", None),
        ({"data": {"kind": "tokens"}}, "data.path is required", None),
        ({"entrypoint": "not a path"}, "package.module:function", None),
        ({"model": None}, "model is required", None),
        ({"parallel": {"zero": 4}}, "zero", "parallel.zero"),
        ({"surprise": 1}, "Extra inputs", "surprise"),
    ],
)
def test_bad_config_is_refused_with_a_clear_message(
    over: dict[str, Any], message: str, field: str | None
) -> None:
    with pytest.raises(InvalidArgument, match=message) as e:
        parse_worker_config(raw(**over))
    if field is not None:
        assert field in e.value.details["fields"]


def test_tokens_to_be_staged_need_no_path_yet() -> None:
    # The agent stages stage.data and sets data.path before the launch.
    staged = {"data": {"url": "https://example.org/tokens.bin"}}
    cfg = parse_worker_config(raw(data={"kind": "tokens"}, stage=staged))
    assert cfg.data.path is None and cfg.stage is not None and cfg.stage.data is not None


def test_load_from_path_or_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(raw()))
    assert load_worker_config(path).job_id == "j"
    monkeypatch.setenv("CPN_WORKER_CONFIG", str(path))
    assert load_worker_config().region == "eu-west"
    monkeypatch.delenv("CPN_WORKER_CONFIG")
    with pytest.raises(InvalidArgument, match="CPN_WORKER_CONFIG"):
        load_worker_config()
    with pytest.raises(InvalidArgument, match="not found"):
        load_worker_config(tmp_path / "nope.json")
    path.write_text("{")
    with pytest.raises(InvalidArgument, match="not valid JSON"):
        load_worker_config(path)
