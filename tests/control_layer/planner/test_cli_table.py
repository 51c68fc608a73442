"""The table `cpn plan` prints."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from control_layer.planner import JobSpec, ResourceSnapshot, plan
from control_layer.planner.cli_table import _sync_cell, render_options

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def test_render_options_prints_every_option_and_its_breakdown() -> None:
    spec = JobSpec.from_yaml_or_json((EXAMPLES / "job-gpt-small.yaml").read_text())
    snap = ResourceSnapshot.from_json((EXAMPLES / "snapshot-3-regions.json").read_text())
    options = plan(spec, snap)
    console = Console(record=True, width=240)
    render_options(options, console)
    text = console.export_text()
    for o in options:
        assert o.id in text
        assert f"{o.estimates.cost.total:,.2f}" in text
        assert f"{o.dp}×{o.tp}×{o.pp}" in text
    assert "bf16" in text  # the precision 'auto' resolved to on these CUDA devices
    for word in ("cheapest", "fastest", "wan_sync", "pp_bubble", "total"):
        assert word in text
    # Returned as a renderable too, for console.print(render_options(options)).
    again = Console(record=True, width=240)
    again.print(render_options(options))
    assert again.export_text() == text


def test_the_sync_cell_says_where_the_exchange_is_hierarchical() -> None:
    spec = JobSpec.from_yaml_or_json((EXAMPLES / "job-gpt-small.yaml").read_text())
    snap = ResourceSnapshot.from_json((EXAMPLES / "snapshot-3-regions.json").read_text())
    o = plan(spec, snap)[0]
    flat = o.model_copy(update={"sync": o.sync.model_copy(update={"hierarchical": False})})
    hier = o.model_copy(update={"sync": o.sync.model_copy(update={"hierarchical": True})})
    assert not _sync_cell(flat).endswith(" hier") and _sync_cell(hier) == _sync_cell(flat) + " hier"
