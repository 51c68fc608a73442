"""The planner's runtime settings: checkpoint interval within 2 % of the run, overlap and streamed
fragments per sync mode, and the options of a real plan carrying them."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from contracts.errors import InvalidArgument
from control_layer.planner import JobSpec, ResourceSnapshot, estimate_option, plan
from control_layer.planner.checkpoint_policy import (
    MAX_CHECKPOINT_FRACTION,
    checkpoint_every,
    checkpoint_fraction,
    checkpoint_write_s,
)
from control_layer.planner.exhaustive import exhaustive_best
from control_layer.planner.placement import Placement
from control_layer.planner.sync_settings import (
    exchange_delay,
    exchange_s,
    overlap_delay,
    payload_bytes,
    sync_settings,
)

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


@pytest.mark.parametrize(
    ("step_s", "write_s", "steps"),
    [(0.1, 0.5, 10_000), (2.0, 10.0, 500), (0.013, 0.31, 5000), (5.0, 0.01, 50)],
)
def test_interval_is_the_smallest_within_two_percent(step_s: float, write_s: float, steps: int) -> None:
    n = checkpoint_every(step_s, write_s, steps)
    assert 1 <= n <= steps
    assert checkpoint_fraction(step_s, write_s, n, steps) <= MAX_CHECKPOINT_FRACTION + 1e-12
    if n > 1:  # one step less would spend more than 2 %
        assert checkpoint_fraction(step_s, write_s, n - 1, steps) > MAX_CHECKPOINT_FRACTION


def test_interval_is_clamped_to_the_run_and_bad_numbers_are_refused() -> None:
    assert checkpoint_every(0.001, 100.0, 40) == 40  # a short run saves at its end only
    assert checkpoint_every(1.0, 0.0, 40) == 1
    for bad in [(math.nan, 1.0, 10), (1.0, math.inf, 10), (-1.0, 1.0, 10), (1.0, 1.0, 0)]:
        with pytest.raises(ValueError):
            checkpoint_every(*bad)
    assert checkpoint_write_s(10**9) > checkpoint_write_s(10**6) > 0


def test_diloco_overlaps_and_streams_large_payloads_blocking_modes_do_not() -> None:
    big = payload_bytes(124_000_000, "int8", 0.01)  # GPT-2 small at int8: 124 MB a round
    s = sync_settings(mode="diloco", every=100, n_regions=3, payload=big, step_s=0.5, bandwidth_bps=1e9)
    assert s.overlap and s.fragments == 4
    # the delay is the exchange of one fragment over the shared uplink, in whole steps
    t = exchange_s(big / 4, 3, 1e9, 0.0)
    assert s.overlap_steps == math.ceil(t / 0.5)
    small = sync_settings(mode="diloco", every=20, n_regions=2, payload=1e6, step_s=0.5, bandwidth_bps=1e8)
    assert small.overlap and small.fragments == 1 and small.overlap_steps == 1
    slow = sync_settings(mode="diloco", every=8, n_regions=2, payload=8e6, step_s=0.01, bandwidth_bps=1e6)
    assert slow.fragments == 1 and slow.overlap_steps == 8 and "blocks" in slow.reason  # capped at a round
    assert sync_settings(mode="async", every=5, n_regions=2, payload=1e6, step_s=1, bandwidth_bps=1e9).overlap
    for mode in ("sync", "local_sgd", "gossip", "ssp"):
        s = sync_settings(mode=mode, every=10, n_regions=3, payload=1e9, step_s=1.0, bandwidth_bps=1e9)
        assert not s.overlap and s.fragments == 1
    assert not sync_settings(
        mode="diloco", every=10, n_regions=1, payload=1e9, step_s=1, bandwidth_bps=None
    ).overlap


def test_overlap_delay_is_the_fewest_steps_that_hide_the_exchange() -> None:
    # sync_quality's workload: 1.34M parameters at coded int8 (0.92 B) over a 3-region ring of 100 Mbit/s
    payload = payload_bytes(1_339_840, "int8", 0.01)
    t = exchange_s(payload, 3, 1e8, 0.0)
    assert 0.13 < t < 0.135
    assert overlap_delay(20, payload, 3, 1e8, 0.0, 0.65) == 1  # a slow step hides it in one
    assert overlap_delay(20, payload, 3, 1e8, 0.0, 0.1) == 2
    assert overlap_delay(20, payload, 3, 1e8, 0.0, 0.001) == 20  # never more than a round: the rest blocks
    assert overlap_delay(20, 0.0, 3, 1e8, 0.0, 1.0) == 1  # applied one step later at the soonest
    assert overlap_delay(20, payload, 3, 0.0, 0.0, 0.1) == 10  # link unknown: half a round


def test_the_delay_follows_the_exchange_as_priced_with_its_calibration() -> None:
    # fp32 DiLoCo of the WAN benchmark's 1.34M parameters, 3 regions at 100 Mbit/s, 0.3 s steps
    payload = payload_bytes(1_339_840, "none", 0.01)
    args = dict(mode="diloco", every=100, n_regions=3, payload=payload, step_s=0.3, bandwidth_bps=1e8)
    assert sync_settings(**args).overlap_steps == 2  # 0.57 s over the links' figures alone
    # The estimate's exchange with a calibrated goodput of 0.74 and per-call seconds: 0.86 s
    priced = sync_settings(**args, exchange_seconds=0.86)
    assert priced.overlap_steps == 3 and "0.86 s" in priced.reason
    assert exchange_delay(100, math.inf, 0.3) == 50  # an unknown exchange: half a round
    assert exchange_delay(100, 0.86, 0.0) == 50  # an unknown step too
    assert exchange_delay(4, 100.0, 0.3) == 4  # never more than a round


def test_every_option_of_a_plan_carries_its_runtime_settings() -> None:
    spec = JobSpec.from_yaml_or_json((EXAMPLES / "job-gpt-small.yaml").read_text())
    snap = ResourceSnapshot.from_json((EXAMPLES / "snapshot-3-regions.json").read_text())
    options = plan(spec, snap)
    for o in options:
        rt = o.runtime
        assert rt is not None
        b = o.estimates.step_s
        step_s = max(0.0, b.total - b.wan_sync - b.checkpoint)  # the local step the policy measures against
        assert rt.checkpoint_every == checkpoint_every(step_s, rt.checkpoint_write_s, spec.training.steps)
        assert rt.checkpoint_fraction <= MAX_CHECKPOINT_FRACTION + 1e-12
        multi = len({t.node for t in o.tasks}) > 1
        assert rt.overlap == multi  # diloco
        if multi:
            assert (
                spec.sync.every % rt.fragments == 0
                and 1 <= rt.overlap_steps <= spec.sync.every // rt.fragments
            )
    pinned = spec.model_copy(update={"training": spec.training.model_copy(update={"checkpoint_every": 250})})
    assert {o.runtime.checkpoint_every for o in plan(pinned, snap)} == {250}


def test_checkpoint_every_is_validated_naming_the_field() -> None:
    text = (
        (EXAMPLES / "job-gpt-small.yaml")
        .read_text()
        .replace("warmup_steps: 700", "warmup_steps: 700, checkpoint_every: 0")
    )
    with pytest.raises(InvalidArgument) as exc:
        JobSpec.from_yaml_or_json(text)
    assert "training.checkpoint_every" in exc.value.message


def test_the_quote_table_shows_the_runtime_settings() -> None:
    from rich.console import Console

    from service_layer.cli.jobs import options_table

    spec = JobSpec.from_yaml_or_json((EXAMPLES / "job-gpt-small.yaml").read_text())
    snap = ResourceSnapshot.from_json((EXAMPLES / "snapshot-3-regions.json").read_text())
    options = [o.model_dump(mode="json") for o in plan(spec, snap)]
    console = Console(width=250, record=True)
    console.print(options_table(options))
    text = console.export_text()
    for o in options:
        rt = o["runtime"]
        assert f"every {rt['checkpoint_every']} " in text
        if rt["overlap"]:
            assert f"overlap {rt['overlap_steps']} steps" in text
    assert any(o["runtime"]["overlap"] for o in options)


def _two_node_cluster() -> ResourceSnapshot:
    dev = {"model": "NVIDIA L40S", "memory_gb": 48.0, "tflops": 330.0}
    return ResourceSnapshot.model_validate(
        {
            "regions": [{"name": "ap-1", "jurisdiction": "APAC"}],
            "clusters": [
                {
                    "id": "c0",
                    "region": "ap-1",
                    "nodes": [
                        {"id": "n0", "devices": [{"index": 0, **dev}]},
                        {"id": "n1", "devices": [{"index": 0, **dev}, {"index": 1, **dev}]},
                    ],
                    "price_per_device_hour": 0.88,
                }
            ],
        }
    )


def test_search_ranks_placements_with_their_runtime_settings() -> None:
    """Two nodes syncing with DiLoCo every 50 steps: overlapped, as the workers run it, the
    exchange (its bytes and the leaders' per-parameter work) hides behind the round and two
    replicas on two nodes are fastest; blocking, it would add its share to every step. The search
    must rank placements as quotes price them."""
    spec = JobSpec.model_validate(
        {
            "name": "small",
            "model": {"n_layers": 4, "d_model": 1024, "n_heads": 16, "vocab": 50304, "seq_len": 1024},
            "training": {"steps": 1000, "global_batch_tokens": 65536},
            "sync": {"mode": "diloco", "every": 50, "compression": "bf16"},
            "qos": {"objective": "time"},
        }
    )
    snap = _two_node_cluster()
    best = plan(spec, snap)[0]
    ref = exhaustive_best(spec, snap)
    assert ref is not None
    assert best.estimates.duration_s <= ref.estimates.duration_s * (1 + 1e-9)
    assert best.dp == 2 and len({t.node for t in best.tasks}) == 2
    assert best.runtime is not None and best.runtime.overlap and best.estimates.step_s.wan_sync == 0.0
    # Priced once: the option's figures are those of its tasks with its own settings.
    again = estimate_option(
        Placement(spec, snap, best.tasks, dp=2, tp=best.tp, pp=best.pp, zero=best.zero), runtime=best.runtime
    )
    assert again.duration_s == pytest.approx(best.estimates.duration_s, rel=1e-12)
    blocking = estimate_option(
        Placement(spec, snap, best.tasks, dp=2, tp=best.tp, pp=best.pp, zero=best.zero)
    )
    assert blocking.duration_s > best.estimates.duration_s * 1.05
