"""Rich rendering of plan options for `cpn plan` (the CLI wires it; this only draws)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from control_layer.planner.plan_types import STEP_PARTS, PlanOption


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}" if seconds < 10 else f"{seconds * 1000:,.0f}"


def options_table(options: Sequence[PlanOption]) -> Table:
    """One row per option: degrees, where, how long, how much, and how a step is spent."""
    table = Table(
        title="Plan options", title_justify="left", show_lines=False, caption="* chosen by the planner"
    )
    table.add_column("id", style="bold")
    table.add_column("label")
    table.add_column("dp×tp×pp", justify="right")
    table.add_column("zero", justify="right")
    table.add_column("precision")
    table.add_column("devices", justify="right")
    table.add_column("regions")
    table.add_column("sync")
    table.add_column("duration", justify="right")
    table.add_column("cost $", justify="right")
    table.add_column("devices $", justify="right")
    table.add_column("egress $", justify="right")
    table.add_column("tok/s", justify="right")
    table.add_column("mem GB", justify="right")
    for o in options:
        e = o.estimates
        table.add_row(
            o.id,
            Text(o.label or "", style="green" if o.label else ""),
            f"{o.dp}×{o.tp}×{o.pp}",
            str(o.zero),
            o.precision + (" +AC" if o.activation_checkpointing else ""),
            str(o.n_devices) + (" spot" if o.spot else ""),
            ", ".join(o.regions),
            _sync_cell(o),
            _duration(e.duration_s),
            f"{e.cost.total:,.2f}",
            f"{e.cost.devices:,.2f}",
            f"{e.cost.egress:,.2f}",
            f"{e.tokens_per_s:,.0f}",
            f"{e.memory_per_device_gb:.1f}",
        )
    return table


def _sync_cell(o: PlanOption) -> str:
    """Mode/H and codec, and "hier" where the exchange reduces through each region's head; ``*``
    marks what the planner chose (the spec said "auto")."""
    rt = o.runtime
    h = "*" if rt is not None and rt.sync_every is not None else ""
    c = "*" if rt is not None and rt.sync_compression is not None else ""
    codec = f" {o.sync.compression}{c}" if o.sync.compression != "none" or c else ""
    hier = " hier" if o.sync.hierarchical else ""
    return f"{o.sync.mode}/{o.sync.every}{h}{codec}{hier}"


def step_table(options: Sequence[PlanOption]) -> Table:
    """Milliseconds per step by part; the parts add up to the total."""
    table = Table(title="Step time breakdown (ms)", title_justify="left")
    table.add_column("id", style="bold")
    for part in STEP_PARTS:
        table.add_column(part, justify="right")
    table.add_column("total", justify="right", style="bold")
    for o in options:
        s = o.estimates.step_s
        table.add_row(o.id, *(_ms(getattr(s, p)) for p in STEP_PARTS), _ms(s.total))
    return table


def render_options(options: Sequence[PlanOption], console: Console | None = None) -> Group:
    """The options and their step breakdowns; printed on `console` when one is given."""
    group = Group(options_table(options), step_table(options))
    if console is not None:
        console.print(group)
    return group
