"""Efficiency per model size class: runs of one size price that size, the device's figure the rest."""

from __future__ import annotations

import pytest

from contracts.job_spec import JobSpec
from control_layer import calibration as cal
from control_layer.planner import cost_model as cm
from control_layer.planner.plan_types import Calibration
from tests.control_layer.test_calibration import _option, _run, _spec


def _model(n_layers: int, d_model: int) -> JobSpec:
    spec = _spec()
    return spec.model_copy(
        update={"model": spec.model.model_copy(update={"n_layers": n_layers, "d_model": d_model})}
    )


SMALL, LARGE, MIDDLE = _model(2, 64), _model(4, 256), _model(2, 128)


def test_a_size_class_spans_a_factor_of_two_around_a_power_of_two() -> None:
    assert cm.size_class(112_384) == "2^17"  # the quote benchmark's xs model (2^16.8)
    assert cm.size_class(3_454_464) == "2^22"  # its l model (2^21.7)
    assert cm.size_class(2**20 * 1.41) == "2^20" and cm.size_class(2**20 * 1.42) == "2^21"
    assert cm.size_class(0) == "2^0"
    assert cm.efficiency_keys("cpu", "fp32", 3_454_464) == ["cpu|fp32|2^22", "cpu|fp32", "cpu"]
    assert cm.efficiency_keys("cpu", "fp32") == ["cpu|fp32", "cpu"]
    assert cm.efficiency_keys("cpu", None, 3_454_464) == ["cpu"]
    # The three test models fall in three classes.
    assert len({cm.size_class(s.model.n_params) for s in (SMALL, LARGE, MIDDLE)}) == 3


def test_the_lookup_takes_the_size_class_then_the_device_then_the_default() -> None:
    table = Calibration(device_efficiency={"CPU|fp32|2^22": 0.8, "cpu|fp32": 1.2, "cuda": 0.4})
    assert cm.device_efficiency("cpu", table, "fp32", n_params=3_454_464) == 0.8
    assert cm.device_efficiency("cpu", table, "fp32", n_params=112_384) == 1.2
    assert cm.device_efficiency("cpu", table, "fp32") == 1.2
    assert cm.device_efficiency("cuda", table, "bf16", n_params=3_454_464) == 0.4
    assert cm.device_efficiency("mps", table, "fp32", n_params=3_454_464, default=0.7) == 0.7
    assert cm.device_efficiency("cpu", None, "fp32", n_params=3_454_464, default=0.7) == 0.7


def test_each_size_class_learns_its_own_efficiency_and_prices_its_own_compute() -> None:
    small, large = _option(spec=SMALL), _option(spec=LARGE)
    assert small.estimates.basis is not None and large.estimates.basis is not None
    small_class, large_class = small.estimates.basis.size_class, large.estimates.basis.size_class
    assert small_class == cm.size_class(SMALL.model.n_params) != large_class
    # The small model's step pays twice its priced work (fixed costs per step weigh on it), the
    # large one's 1.25x.
    state, changes = cal.update(cal.State(), _run(small, compute_s=2 * small.estimates.step_s.compute))
    state, _ = cal.update(state, _run(large, compute_s=1.25 * large.estimates.step_s.compute, job="j2"))
    e0 = cm.DEFAULT_DEVICE_EFFICIENCY
    factors = {key: f.value for (kind, key), f in state.factors.items() if kind == cal.EFFICIENCY}
    assert factors == {
        f"cpu|fp32|{small_class}": pytest.approx(e0 / 2),
        f"cpu|fp32|{large_class}": pytest.approx(e0 / 1.25),
        # The device's figure moves with every size: the fallback for a size no run has had.
        "cpu|fp32": pytest.approx(e0 / 2 + cal.ALPHA * (e0 / 1.25 - e0 / 2)),
    }
    assert {(c.key, c.old) for c in changes if c.kind == cal.EFFICIENCY} == {
        ("cpu|fp32", None),
        (f"cpu|fp32|{small_class}", None),
    }

    # Quoted again, each size is priced at what its own run paid, and records the figure it used.
    calibration = cal.to_calibration(state)
    assert calibration.device_efficiency == factors  # as GET /v1/calibration shows the table
    again_small, again_large = _option(calibration, spec=SMALL), _option(calibration, spec=LARGE)
    assert again_small.estimates.step_s.compute == pytest.approx(2 * small.estimates.step_s.compute)
    assert again_large.estimates.step_s.compute == pytest.approx(1.25 * large.estimates.step_s.compute)
    assert again_large.estimates.basis is not None
    assert again_large.estimates.basis.efficiency == {"cpu|fp32": pytest.approx(e0 / 1.25)}
    # A size between them that no run has had takes the device's figure.
    middle = _option(calibration, spec=MIDDLE)
    assert middle.estimates.basis is not None
    assert middle.estimates.basis.efficiency == {"cpu|fp32": pytest.approx(factors["cpu|fp32"])}


def test_a_run_quoted_at_its_size_class_figure_moves_both_factors_to_what_it_paid() -> None:
    small = _option(spec=SMALL)
    state, _ = cal.update(cal.State(), _run(small, compute_s=2 * small.estimates.step_s.compute))
    large = _option(spec=LARGE)
    state, _ = cal.update(state, _run(large, compute_s=large.estimates.step_s.compute, job="j2"))
    # Quoted at the small class's figure, the next small run pays exactly its new estimate: the
    # implied efficiency is the class's own, and only the device's figure moves toward it.
    calibration = cal.to_calibration(state)
    second = _option(calibration, spec=SMALL)
    before = dict(state.factors)
    state, _ = cal.update(state, _run(second, compute_s=second.estimates.step_s.compute, job="j3"))
    klass = f"cpu|fp32|{cm.size_class(SMALL.model.n_params)}"
    kept = before[(cal.EFFICIENCY, klass)].value
    assert state.factors[(cal.EFFICIENCY, klass)].value == pytest.approx(kept)
    assert state.factors[(cal.EFFICIENCY, klass)].runs == 2
    device = before[(cal.EFFICIENCY, "cpu|fp32")].value
    assert state.factors[(cal.EFFICIENCY, "cpu|fp32")].value == pytest.approx(
        device + cal.ALPHA * (kept - device)
    )


def test_an_estimate_that_recorded_no_size_class_teaches_only_the_devices_figure() -> None:
    option = _option(spec=SMALL)
    assert option.estimates.basis is not None
    old = option.model_copy(
        update={
            "estimates": option.estimates.model_copy(
                update={"basis": option.estimates.basis.model_copy(update={"size_class": ""})}
            )
        }
    )
    state, _ = cal.update(cal.State(), _run(old, compute_s=2 * old.estimates.step_s.compute))
    assert [key for kind, key in state.factors if kind == cal.EFFICIENCY] == ["cpu|fp32"]
