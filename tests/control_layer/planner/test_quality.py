"""The measured loss/quality trade-off the planner quotes."""

from __future__ import annotations

import pytest

from control_layer.planner.quality import MEASURED, quality


def test_sync_is_the_reference_and_unmeasured_settings_say_so() -> None:
    assert quality("sync", 1, "none").loss_ratio == 1.0  # type: ignore[union-attr]
    assert quality("ssp", 10, "int8") is None
    assert quality("diloco", 20, "topk") is None


def test_nearest_measured_interval_is_used_and_named() -> None:
    q = quality("diloco", 25, "none")
    assert q is not None and q.loss_ratio == pytest.approx(MEASURED[("diloco", 20, "none", False)])
    assert q.measured_as == "diloco H=20 none"
    overlapped = quality("diloco", 20, "int8", overlap=True)
    assert overlapped is not None and "overlapped" in overlapped.measured_as


def test_measured_ratios_are_plausible_losses() -> None:
    assert all(0.5 < r < 2.0 for r in MEASURED.values())
