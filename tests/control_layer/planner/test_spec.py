"""The job spec: validation names the field, YAML and JSON parse the same, the model's size."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from contracts.errors import InvalidArgument
from contracts.job_spec import JobSpec, ParallelismSpec

BASE = {
    "name": "gpt-small",
    "model": {"n_layers": 12, "d_model": 768, "n_heads": 12, "vocab": 50257, "seq_len": 1024},
    "training": {"steps": 10, "global_batch_tokens": 8192},
}


def test_defaults_and_auto_parallelism() -> None:
    spec = JobSpec.model_validate(BASE)
    assert spec.parallelism == "auto"
    assert spec.pinned == ParallelismSpec()
    # H and the codec are the planner's unless the spec sets them (``planner.sync_choice``)
    assert spec.sync.mode == "diloco" and spec.sync.every == "auto" and spec.sync.compression == "auto"
    assert spec.sync.chosen_by_planner == ("every", "compression")
    assert spec.global_batch_sequences == 8


def test_yaml_and_json_give_the_same_spec() -> None:
    yaml_text = """
name: gpt-small
model: {n_layers: 12, d_model: 768, n_heads: 12, vocab: 50257, seq_len: 1024}
training: {steps: 10, global_batch_tokens: 8192}
parallelism: {dp: 2, zero: 1}
qos: {max_hours: 48, regions: [eu-west], accelerators: [H100]}
"""
    a = JobSpec.from_yaml_or_json(yaml_text)
    b = JobSpec.from_yaml_or_json(json.dumps(a.model_dump(mode="json")))
    assert a == b
    assert a.pinned.dp == 2 and a.pinned.zero == 1 and a.pinned.tp is None


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"model": {**BASE["model"], "d_model": 770}}, "model"),
        ({"model": {**BASE["model"], "n_layers": 0}}, "model.n_layers"),
        ({"training": {"steps": 10, "global_batch_tokens": 1000}}, "(root)"),
        ({"training": {"steps": 10, "global_batch_tokens": 8192, "warmup_steps": 11}}, "training"),
        ({"name": "Bad Name!"}, "name"),
        ({"entrypoint": "not a target"}, "entrypoint"),
        ({"data": {"kind": "tokens"}}, "data"),
        ({"sync": {"topk_ratio": 0}}, "sync.topk_ratio"),
        ({"sync": {"mode": "allreduce"}}, "sync.mode"),
        ({"qos": {"max_hours": -1}}, "qos.max_hours"),
        ({"qos": {"colour": "red"}}, "qos.colour"),
        ({"parallelism": {"zero": 4}}, "parallelism"),
    ],
)
def test_bad_specs_name_the_field(patch: dict, field: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        JobSpec.from_yaml_or_json(json.dumps({**BASE, **patch}))
    fields = [e["field"] for e in err.value.details["errors"]]
    assert any(f.startswith(field) for f in fields), fields
    assert field.split(".")[0] in err.value.message or field == "(root)"


def test_pydantic_errors_at_the_rest_edge_name_the_field_too() -> None:
    with pytest.raises(ValidationError) as err:
        JobSpec.model_validate({**BASE, "qos": {"min_gpu_mem_gb": 0}})
    assert err.value.errors()[0]["loc"] == ("qos", "min_gpu_mem_gb")


def test_entrypoint_accepts_module_colon_function() -> None:
    spec = JobSpec.model_validate({**BASE, "entrypoint": "my_pkg.train:main"})
    assert spec.entrypoint == "my_pkg.train:main"


def test_not_a_mapping_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="mapping"):
        JobSpec.from_yaml_or_json("- just\n- a list\n")


def test_precision_defaults_to_auto() -> None:
    assert JobSpec.model_validate(BASE).training.precision == "auto"


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"entrypoint_parallelism": ["dp"]}, "applies only with an entrypoint"),
        ({"entrypoint": "pkg.mod:fn", "entrypoint_parallelism": ["dp", "tp"]}, "'tp' is not available"),
        ({"entrypoint": "pkg.mod:fn", "entrypoint_parallelism": ["zero"]}, "'dp' is required"),
        ({"entrypoint": "pkg.mod:fn", "parallelism": {"pp": 2}}, "tp = pp = 1"),
        ({"entrypoint": "pkg.mod:fn", "parallelism": {"zero": 3}}, "needs 'zero' in entrypoint_parallelism"),
    ],
)
def test_entrypoint_parallelism_is_what_the_runtime_gives_a_byo_model(patch: dict, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        JobSpec.from_yaml_or_json(json.dumps({**BASE, **patch}))
    ok = JobSpec.model_validate(
        {
            **BASE,
            "entrypoint": "pkg.mod:fn",
            "entrypoint_parallelism": ["dp", "zero"],
            "parallelism": {"zero": 3},
        }
    )
    assert ok.byo_parallelism == ("dp", "zero")
