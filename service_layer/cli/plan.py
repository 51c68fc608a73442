"""``cpn plan``: plan a job against a saved snapshot, offline (the same function the server uses)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from service_layer.cli.common import JsonOpt, console, err_console, fail


def plan_command(
    snapshot: Annotated[
        Path,
        typer.Option(
            "--snapshot", help="ResourceSnapshot JSON (cpn snapshot export)", exists=True, dir_okay=False
        ),
    ],
    job: Annotated[Path, typer.Option("--job", help="Job spec, YAML or JSON", exists=True, dir_okay=False)],
    as_json: JsonOpt = False,
) -> None:
    """Rank priced options for a job on a saved fleet snapshot; nothing is contacted."""
    from contracts.errors import InvalidArgument, NoFeasiblePlan
    from contracts.job_spec import JobSpec
    from control_layer.planner import plan
    from control_layer.planner.snapshot import ResourceSnapshot

    try:
        spec = JobSpec.from_yaml_or_json(job.read_text())
        snap = ResourceSnapshot.from_json(snapshot.read_text())
        options = plan(spec, snap)
    except InvalidArgument as exc:
        for e in exc.details.get("errors", []):
            err_console.print(f"[red]  {e['field']}: {e['message']}[/]")
        fail(exc.message, code=2)
    except NoFeasiblePlan as exc:
        explanation = exc.details.get("explanation")
        if explanation:
            err_console.print("[yellow]why:[/]")
            for line in explanation if isinstance(explanation, list) else [explanation]:
                err_console.print(f"  {line if isinstance(line, str) else json.dumps(line)}")
        fail(f"no feasible plan: {exc.message}")
    if as_json:
        typer.echo(json.dumps([o.model_dump(mode="json") for o in options], indent=2))
    else:
        from control_layer.planner.cli_table import render_options  # the planner's own table

        console.print(render_options(options))
