"""Follow a job: a progress bar (step/total, loss, tokens/s) and its events, until it ends."""

from __future__ import annotations

import time
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from contracts.states import JOB_TERMINAL, JobState
from service_layer.cli.common import console
from service_layer.client import CpnClient

TERMINAL = JOB_TERMINAL


def _describe(event: dict[str, Any]) -> str:
    payload = event.get("payload") or {}
    extra = payload.get("reason") or payload.get("message") or ""
    return f"[dim]{event.get('created_at', '')[11:19]}[/] {event.get('kind')}" + (
        f" — {extra}" if extra else ""
    )


def watch_job(
    client: CpnClient, job_id: str, *, interval_s: float = 1.0, timeout_s: float | None = None
) -> dict[str, Any]:
    """Poll the job and its new events until it ends; return the final job."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    last_event = 0
    with Progress(
        TextColumn("[bold]{task.description:<10}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        bar = progress.add_task(JobState.QUEUED, total=None, info="")
        while True:
            job = client.job(job_id)
            for event in client.events(job_id, after=last_event, follow=False):
                if event["event"] == "message" and isinstance(event["data"], dict):
                    progress.console.print(_describe(event["data"]))
                    last_event = max(last_event, int(event["data"].get("id") or 0))
            p = job.get("progress") or {}
            total = p.get("total_steps") or ((job.get("spec") or {}).get("training") or {}).get("steps")
            info = ""
            if p.get("loss") is not None:
                info = f"loss {p['loss']:.4f}  {p.get('tokens_per_s', 0):,.0f} tok/s"
            progress.update(
                bar, description=job["status"], completed=p.get("step", 0), total=total, info=info
            )
            if job["status"] in TERMINAL:
                return job
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {job['status']} after {timeout_s:.0f}s")
            time.sleep(interval_s)
