"""When nothing is feasible, the explanation says which constraint removed what."""

from __future__ import annotations

import pytest

from contracts.errors import NoFeasiblePlan
from control_layer.planner import JobSpec, ResourceSnapshot, plan
from service_layer.errors import http_status_for


def _snap() -> ResourceSnapshot:
    def cluster(cid: str, region: str, model: str, mem: float, n: int) -> dict:
        devices = [{"index": i, "model": model, "memory_gb": mem, "tflops": 300.0} for i in range(n)]
        return {
            "id": cid,
            "region": region,
            "price_per_device_hour": 2.0,
            "nodes": [{"id": f"{cid}-n", "devices": devices}],
        }

    return ResourceSnapshot.model_validate(
        {
            "regions": [{"name": "eu-west", "jurisdiction": "EU"}, {"name": "us-east", "jurisdiction": "US"}],
            "clusters": [
                cluster("eu1", "eu-west", "A100-40GB", 40, 8),
                cluster("us1", "us-east", "H100", 80, 8),
            ],
            "links": [{"src": "eu-west", "dst": "us-east", "bandwidth_gbps": 10, "latency_ms": 80}],
        }
    )


def _spec(**over) -> JobSpec:
    base = {
        "name": "j",
        "model": {"n_layers": 4, "d_model": 1024, "n_heads": 16, "vocab": 32000, "seq_len": 1024},
        "training": {"steps": 1000, "global_batch_tokens": 1024 * 8},
    }
    return JobSpec.model_validate({**base, **over})


def _explain(spec: JobSpec) -> tuple[str, list[dict]]:
    with pytest.raises(NoFeasiblePlan) as err:
        plan(spec, _snap())
    assert err.value.code == "no_feasible_plan" and http_status_for(err.value) == 409
    return err.value.message, err.value.details["explanation"]


def test_residency_removes_every_region() -> None:
    message, why = _explain(_spec(qos={"data_residency": "CN"}))
    step = next(e for e in why if e["constraint"] == "qos.data_residency")
    assert step["removed_clusters"] == 2 and step["removed_devices"] == 16 and step["left_devices"] == 0
    assert "qos.data_residency" in message


def test_filters_are_applied_in_turn() -> None:
    _, why = _explain(_spec(qos={"regions": ["eu-west"], "min_gpu_mem_gb": 60}))
    assert [e["constraint"] for e in why[1:3]] == ["qos.regions", "qos.min_gpu_mem_gb"]
    assert why[1]["removed_devices"] == 8 and why[2]["left_devices"] == 0


def test_too_few_devices_for_the_pinned_layout() -> None:
    message, why = _explain(_spec(parallelism={"dp": 8, "tp": 2, "pp": 1}, qos={"regions": ["eu-west"]}))
    assert why[-1]["constraint"] == "capacity"
    assert "no region in ['eu-west'] has 16 free devices with ≥ 40 GB" in message


def test_model_too_large_for_any_device() -> None:
    huge = {"n_layers": 4, "d_model": 32768, "n_heads": 16, "vocab": 32000, "seq_len": 1024}
    message, why = _explain(_spec(model=huge, parallelism={"tp": 1, "pp": 1, "zero": 0}))
    assert why[-1]["constraint"] == "memory" and "GB per device" in message


def test_deadline_and_budget() -> None:
    message, why = _explain(_spec(qos={"max_hours": 0.0001}))
    assert why[-1]["constraint"] == "qos.max_hours" and "fastest plan takes" in message
    message, why = _explain(_spec(qos={"max_cost": 0.0001}))
    assert why[-1]["constraint"] == "qos.max_cost" and "cheapest plan costs" in message


def test_pin_that_does_not_fit_the_model() -> None:
    _, why = _explain(_spec(parallelism={"tp": 3}))
    assert any(
        e["constraint"] == "parallelism" and "does not divide model.n_heads" in e["detail"] for e in why
    )
