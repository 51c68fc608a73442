"""Client commands for users: quote, and jobs submit/list/show/watch/cancel (and preempt, for admins)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from contracts.states import JobState
from service_layer.cli.artifacts import progress_line
from service_layer.cli.common import (
    DEFAULT_SERVER,
    ApiKeyOpt,
    JsonOpt,
    ServerOpt,
    api,
    console,
    fail,
    load_spec,
    print_json,
)
from service_layer.cli.job_inputs import attach_code, attach_shards
from service_layer.cli.watch import watch_job
from service_layer.transfers import DigestMismatch, file_digest

jobs_app = typer.Typer(help="Submit and follow training jobs.", no_args_is_help=True)

SpecFile = Annotated[
    Path, typer.Option("-f", "--file", help="Job spec, YAML or JSON", exists=True, dir_okay=False)
]


def _money(v: float | None) -> str:
    return "–" if v is None else f"${v:,.6f}" if v < 1 else f"${v:,.2f}"


def _secs(v: float | None) -> str:
    if v is None:
        return "–"
    return f"{v:.1f}s" if v < 10 else f"{v:,.0f}s" if v < 3600 else f"{v / 3600:,.2f}h"


def options_table(options: list[dict[str, Any]]) -> Table:
    table = Table(title="options", caption="sync: * = chosen by the planner (the spec said 'auto')")
    cols = (
        "id",
        "label",
        "dp·tp·pp·zero",
        "regions",
        "devices",
        "est. time",
        "est. cost",
        "checkpoint",
        "sync",
    )
    for col in cols:
        table.add_column(col, no_wrap=col != "regions")
    for o in options:
        e = o["estimates"]
        table.add_row(
            o["id"],
            o.get("label") or "",
            f"{o['dp']}·{o['tp']}·{o['pp']}·{o['zero']}",
            ", ".join(o.get("regions") or []),
            str(len(o.get("tasks") or [])),
            _secs(e.get("duration_s")),
            _money((e.get("cost") or {}).get("total")),
            *_runtime_cells(o.get("runtime") or {}, o.get("sync") or {}),
        )
    return table


def _runtime_cells(rt: dict[str, Any], sync: dict[str, Any]) -> tuple[str, str]:
    """What the workers get beyond the shape: checkpoint interval, sync mode, H and codec (``*``:
    the planner's choice), overlap and fragments."""
    if not rt:
        return "–", "–"
    ckpt = f"every {rt['checkpoint_every']} ({rt.get('checkpoint_fraction', 0) * 100:.1f} %)"
    h = f"H={sync.get('every')}{'*' if rt.get('sync_every') is not None else ''}"
    codec = f"{sync.get('compression')}{'*' if rt.get('sync_compression') is not None else ''}"
    head = f"{sync.get('mode')} {h} {codec}, " if sync else ""
    if not rt.get("overlap"):
        return ckpt, f"{head}blocking"
    frag = f", {rt['fragments']} fragments" if rt.get("fragments", 1) > 1 else ""
    return ckpt, f"{head}overlap {rt.get('overlap_steps') or '½ round'} steps{frag}"


def print_job(job: dict[str, Any]) -> None:
    console.print(
        f"[bold]{job['name']}[/] {job['id']}  status [bold]{job['status']}[/]"
        + (f"  ({job['reason']})" if job.get("reason") else "")
    )
    queue = job.get("queue")
    if queue:
        position = queue.get("position") or "–"
        console.print(f"queue position {position}: {queue.get('reason') or ''}", markup=False)
    p = job.get("progress")
    if p:
        loss = f"{p['loss']:.4f}" if p.get("loss") is not None else "–"
        console.print(f"step {p['step']}/{p['total_steps']}  loss {loss}  {p['tokens_per_s']:,.0f} tok/s")
    if job.get("tasks"):
        table = Table(title="placement")
        for col in ("task", "region", "cluster", "node", "devices", "status"):
            table.add_column(col)
        for t in job["tasks"]:
            table.add_row(
                t["id"][:8],
                t["region"],
                t.get("cluster_name") or t["cluster_id"][:8],
                t["node_id"][:8],
                ",".join(str(d) for d in t["device_indices"]),
                t["status"],
            )
        console.print(table)
    est = job.get("estimates") or {}
    console.print(
        f"time  estimated {_secs(est.get('duration_s'))}, actual {_secs(job.get('actual_duration_s'))}"
    )
    console.print(f"cost  estimated {_money(est.get('cost_total'))}, actual {_money(job.get('actual_cost'))}")
    result = job.get("result") or {}
    final = result.get("final_loss", result.get("loss_end"))
    if isinstance(final, int | float):
        floor = job.get("entropy_floor")
        start = result.get("loss_start")
        console.print(
            "loss  "
            + (f"{start:.4f} -> " if isinstance(start, int | float) else "final ")
            + f"{final:.4f}"
            + (f"  (entropy floor {floor:.4f}, gap {final - floor:+.4f})" if floor is not None else "")
        )


def quote(
    file: SpecFile, server: ServerOpt = DEFAULT_SERVER, api_key: ApiKeyOpt = None, as_json: JsonOpt = False
) -> None:
    """Ask for priced options for a job spec (nothing is started)."""
    spec = load_spec(file)
    with api(server, api_key) as client:
        q = client.quote(spec)
    if as_json:
        print_json(q)
        return
    console.print(options_table(q["options"]))
    console.print(
        f"quote [bold]{q['id']}[/] valid until {q['expires_at']}; accept with "
        f"[cyan]cpn jobs submit --quote {q['id']} --option <id>[/]"
    )


@jobs_app.command("submit")
def submit(
    file: Annotated[
        Path | None, typer.Option("-f", "--file", help="Job spec, YAML or JSON", exists=True, dir_okay=False)
    ] = None,
    choice: Annotated[str, typer.Option(help="cheapest | fastest | balanced (with --file)")] = "cheapest",
    quote_id: Annotated[str | None, typer.Option("--quote", help="Accept an option of this quote")] = None,
    option_id: Annotated[
        str | None, typer.Option("--option", help="The option to accept (with --quote)")
    ] = None,
    watch: Annotated[bool, typer.Option("--watch", help="Follow the job until it ends")] = False,
    code: Annotated[
        Path | None,
        typer.Option(
            "--code", exists=True, help="Code directory (or a .tar.gz): packed, uploaded, set as code"
        ),
    ] = None,
    include: Annotated[
        list[str] | None, typer.Option("--include", help="Only files matching this glob (repeatable)")
    ] = None,
    exclude: Annotated[
        list[str] | None,
        typer.Option("--exclude", help="Leave out files matching this glob (repeatable; .git etc. always)"),
    ] = None,
    shard: Annotated[
        list[str] | None,
        typer.Option("--shard", help="REGION=FILE[:resident]: upload FILE as that region's data shard"),
    ] = None,
    server: ServerOpt = DEFAULT_SERVER,
    api_key: ApiKeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Submit a job: from a spec file (planned now, option picked by --choice) or a quote's option.
    With --code, the directory is packed (deterministically: an unchanged tree is not uploaded
    again) and uploaded first, and the spec's code.digest set to it."""
    if (file is None) == (quote_id is None):
        raise typer.BadParameter("give either --file or --quote (with --option)")
    if quote_id and not option_id:
        raise typer.BadParameter("--quote needs --option")
    if (code or shard) and not file:
        raise typer.BadParameter("--code and --shard go with --file")
    spec = load_spec(file) if file else None
    with api(server, api_key) as client:
        if spec is not None and code is not None:
            attach_code(client, spec, code, include or (), exclude or ())
        if spec is not None and shard:
            attach_shards(client, spec, shard)
        job = client.submit(spec=spec, choice=choice, quote_id=quote_id, option_id=option_id)
        if as_json and not watch:
            print_json(job)
            return
        console.print(f"submitted job [bold]{job['id']}[/] ({job['status']})")
        if watch:
            job = watch_job(client, job["id"])
            print_job(job)
            raise typer.Exit(0 if job["status"] == JobState.SUCCEEDED else 1)


@jobs_app.command("list")
def list_jobs(
    status: Annotated[str | None, typer.Option(help="Only jobs in this state")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
    server: ServerOpt = DEFAULT_SERVER,
    api_key: ApiKeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Your jobs, newest first."""
    with api(server, api_key) as client:
        jobs = client.jobs(status=status, limit=limit)
    if as_json:
        print_json(jobs)
        return
    table = Table(title="jobs")
    for col in ("id", "name", "status", "progress", "regions", "est. cost", "created"):
        table.add_column(col)
    for j in jobs:
        p = j.get("progress")
        table.add_row(
            j["id"][:12],
            j["name"],
            j["status"],
            f"{p['step']}/{p['total_steps']}" if p else "–",
            ", ".join(j.get("regions") or []),
            _money(j.get("estimated_cost")),
            j["created_at"][:19],
        )
    console.print(table)


@jobs_app.command("show")
def show(
    job_id: str, server: ServerOpt = DEFAULT_SERVER, api_key: ApiKeyOpt = None, as_json: JsonOpt = False
) -> None:
    """A job in full: status, placement, progress, estimates against actual."""
    with api(server, api_key) as client:
        job = client.job(job_id)
    if as_json:
        print_json(job)
    else:
        print_job(job)


@jobs_app.command("watch")
def watch(
    job_id: str,
    interval: Annotated[float, typer.Option(min=0.1, help="Seconds between updates")] = 1.0,
    server: ServerOpt = DEFAULT_SERVER,
    api_key: ApiKeyOpt = None,
) -> None:
    """Follow a job with a progress bar until it ends (exit 0 if it succeeded)."""
    with api(server, api_key) as client:
        job = watch_job(client, job_id, interval_s=interval)
    print_job(job)
    raise typer.Exit(0 if job["status"] == JobState.SUCCEEDED else 1)


def _log_line(line: dict[str, Any]) -> str:
    return f"[{line['task_id'][:8]}/{line['region']} {line['stream']}] {line['line']}"


@jobs_app.command("logs")
def logs(
    job_id: str,
    task: Annotated[str | None, typer.Option("--task", help="Only this task (its id or a prefix)")] = None,
    tail: Annotated[
        int | None, typer.Option("--tail", min=1, max=10_000, help="Only the last N lines")
    ] = None,
    follow: Annotated[
        bool, typer.Option("-f", "--follow", help="Keep printing new lines until the job ends")
    ] = False,
    server: ServerOpt = DEFAULT_SERVER,
    api_key: ApiKeyOpt = None,
) -> None:
    """The job's workers' output, as `[task/region stream] line`; -f follows until the job ends."""
    with api(server, api_key) as client:
        if follow:
            for event in client.follow_logs(job_id, task=task, tail=tail):
                if event["event"] == "end":
                    console.print(f"[dim]job {job_id} {event['data'].get('status')}[/]", highlight=False)
                    return
                if isinstance(event["data"], dict):
                    print(_log_line(event["data"]), flush=True)
            return
        after = 0
        while True:
            page = client.logs(job_id, task=task, tail=tail, after=after, limit=1000)
            for line in page["lines"]:
                print(_log_line(line))
            if not page["more"]:
                return
            after = page["next_after"]


@jobs_app.command("cancel")
def cancel(
    job_id: str,
    reason: Annotated[str, typer.Option(help="Recorded on the job")] = "cancelled by user",
    server: ServerOpt = DEFAULT_SERVER,
    api_key: ApiKeyOpt = None,
) -> None:
    """Cancel a job that has not finished."""
    with api(server, api_key) as client:
        job = client.cancel(job_id, reason)
    console.print(f"job {job['id']} {job['status']}")


@jobs_app.command("preempt")
def preempt(
    job_id: str,
    reason: Annotated[str, typer.Option(help="Recorded on the job and its events")] = "by an operator",
    by: Annotated[str | None, typer.Option("--by", help="The job it makes room for")] = None,
    grace: Annotated[
        float, typer.Option(min=0.1, max=600, help="Seconds to checkpoint and stop before being cancelled")
    ] = 30.0,
    server: ServerOpt = DEFAULT_SERVER,
    api_key: ApiKeyOpt = None,
) -> None:
    """Preempt a running preemptible job (admin): it checkpoints, stops and goes back to the queue."""
    with api(server, api_key) as client:
        job = client.preempt(job_id, reason, by_job_id=by, grace_s=grace)
    console.print(f"job {job['id']} {job['status']}: preempting ({reason}); it resumes from its checkpoint")


@jobs_app.command("download")
def download(
    job_id: Annotated[str, typer.Argument(help="The job")],
    out: Annotated[Path, typer.Option("-o", "--output", help="Directory to write the files to")] = Path("."),
    server: ServerOpt = DEFAULT_SERVER,
    api_key: ApiKeyOpt = None,
) -> None:
    """Fetch every output of the job (its model, config, checkpoint) into a directory; a partial
    file from an earlier try is resumed, and each file's SHA-256 is checked before it is kept."""
    out.mkdir(parents=True, exist_ok=True)
    with api(server, api_key) as client:
        rows = client.job_artifacts(job_id)
        if not rows:
            fail(f"job {job_id} has no outputs (yet)")
        for row in rows:
            name = Path(row["name"]).name or row["id"]
            dest = out / name
            if dest.is_file() and dest.stat().st_size == row["bytes"] and file_digest(dest) == row["digest"]:
                console.print(f"{dest}: up to date", markup=False)
                continue
            try:
                client.download_artifact(row, dest, progress=progress_line(name))
            except DigestMismatch as exc:
                fail(str(exc))
            console.print(f"{dest}  {row['bytes']:,} bytes  {row['digest']}", markup=False)
