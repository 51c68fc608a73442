"""The REST quote shows each option's held-out loss penalty with where it comes from: this job's
calibration (with its interval) where the spec carries one, the one-model table otherwise."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from service_layer.client import CpnClient
from service_layer.server import ServerHandle

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)

CALIBRATION = {
    "every": 20, "steps": 60, "regions": 3, "heldout_batches": 16, "seconds": 40.0,
    "trials": [{"compression": "int8", "overlap": True, "delay": 2, "merge": "progress",
                "loss_ratio": 1.002, "stderr": 0.0005}],
}  # fmt: skip


def _spec(sync: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "calibrated",
        "model": {"n_layers": 2, "d_model": 64, "n_heads": 4, "vocab": 256, "seq_len": 64},
        "training": {"steps": 400, "global_batch_tokens": 64 * 8},
        "parallelism": {"dp": 2},
        "sync": sync,
    }


def test_the_quote_shows_the_measured_penalty_and_its_interval(
    server: ServerHandle, admin: CpnClient
) -> None:
    from tests.service_layer.harness import seed_fleet

    seed_fleet(server, admin)
    table = admin.quote(_spec({"mode": "diloco"}))["options"]
    spanning = [o for o in table if len({t["cluster"] for t in o["tasks"]}) > 1]
    assert spanning
    for o in spanning:
        assert o["sync"]["loss_penalty_source"] == "table" and o["sync"]["loss_penalty_low"] is None
        assert "confidence unknown" in o["sync"]["loss_penalty_basis"]
    measured = admin.quote(_spec({"mode": "diloco", "calibration": CALIBRATION}))["options"]
    spanning = [o for o in measured if len({t["cluster"] for t in o["tasks"]}) > 1]
    assert spanning
    for o in spanning:
        s = o["sync"]
        assert (s["compression"], s["loss_penalty_source"]) == ("int8", "measured")
        assert s["loss_penalty"] == pytest.approx(0.002)
        assert s["loss_penalty_low"] < 0.002 < s["loss_penalty_high"]
        assert "this job's model and data" in s["loss_penalty_basis"]


def test_a_calibration_out_of_bounds_gets_a_422_naming_the_field(server: ServerHandle) -> None:
    from tests.service_layer.harness import ADMIN_KEY

    bad = {**CALIBRATION, "trials": [{**CALIBRATION["trials"][0], "loss_ratio": 9.0}]}
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    r = httpx.post(
        server.http_url + "/v1/quotes", json=_spec({"calibration": bad}), headers=headers, timeout=10
    )
    assert r.status_code == 422, r.text
    assert [e["field"] for e in r.json()["details"]["errors"]] == ["sync.calibration.trials.0.loss_ratio"]
