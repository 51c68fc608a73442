"""``cpn calibrate``: measure what int8 and overlap cost a job's own model and data before it is
submitted, and write the spec with the result (``sync.calibration``) for ``cpn quote`` and
``cpn jobs submit``: the planner then picks the codec and overlap from it and the quote shows the
measured penalty with its interval (``control_layer.planner.calibrated``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
import yaml

from contracts.errors import InvalidArgument
from contracts.job_spec import JobSpec

MAX_BUDGET_S = 24 * 3600.0


def calibrate_command(
    job: Annotated[Path, typer.Option("--job", help="Job spec, YAML or JSON", exists=True, dir_okay=False)],
    out: Annotated[Path, typer.Option("--out", help="Where to write the spec with its calibration")],
    regions: Annotated[int, typer.Option(min=2, max=8, help="Regions simulated")] = 3,
    every: Annotated[int | None, typer.Option(min=1, max=100_000, help="H (default: spec, else 20)")] = None,
    rounds: Annotated[int, typer.Option(min=1, max=1000, help="Rounds in the slice")] = 3,
    local_batch: Annotated[int | None, typer.Option(min=1, max=65_536, help="Sequences per region")] = None,
    budget_s: Annotated[float, typer.Option(min=1.0, max=MAX_BUDGET_S, help="Wall-time budget")] = 900.0,
    threads: Annotated[int, typer.Option(min=1, max=1024, help="CPU threads for torch")] = 1,
) -> None:
    """Train a few rounds of the job with each candidate codec/overlap and with fp32 blocking, in
    one process on CPU, and compare their held-out loss; the spec with the result goes to --out."""
    import torch

    from training.calibration import calibrate, candidates_for, slice_for

    torch.set_num_threads(threads)
    try:
        spec = JobSpec.from_yaml_or_json(job.read_text())
        sl = slice_for(spec, regions=regions, every=every, rounds=rounds, local_batch=local_batch)
    except InvalidArgument as exc:
        typer.echo(f"invalid: {exc.message}", err=True)
        raise typer.Exit(2) from exc
    result = calibrate(sl, candidates_for(sl.every), budget_s=budget_s, stop_at_pass=True)
    if result is None:
        typer.echo(f"no trial fits in {budget_s:g} s: give a larger --budget-s or fewer --rounds", err=True)
        raise typer.Exit(1)
    for t in result.trials:
        how = f"overlapped, {t.delay} step(s) late" if t.overlap else "blocking"
        typer.echo(f"{t.compression} {how}: held-out loss {t.loss_ratio - 1:+.3%} ± {1.96 * t.stderr:.3%} "
                   f"against fp32 blocking at H={result.every}")  # fmt: skip
    calibrated = spec.model_copy(update={"sync": spec.sync.model_copy(update={"calibration": result})})
    body = calibrated.model_dump(mode="json", exclude_none=True)
    text = json.dumps(body, indent=2) if out.suffix == ".json" else yaml.safe_dump(body, sort_keys=False)
    out.write_text(text)
    typer.echo(f"wrote {out} ({result.seconds:.0f} s)")
