"""The provider's retention: a job's checkpoints and run dirs leave the node a set time after the
job's last assignment here ended, never while a task of the job runs on it.

Run dirs are ``<work_dir>/assignments/<id>/`` (the job named in their ``worker_config.json``,
their end marked by ``ended``); checkpoints are ``<work_dir>/checkpoints/<job_id>/`` (the control
plane's ``checkpoint_dir``, also where copies from other nodes land).
"""

from __future__ import annotations

import json
import logging
import shutil
import uuid
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from agent.workers import ENDED_MARK

log = logging.getLogger(__name__)
TRASH = "trash"  # under the work dir: what is being deleted


@dataclass
class JobDirs:
    run_dirs: list[Path] = field(default_factory=list)
    checkpoints: Path | None = None
    last_at: float = 0.0  # unix seconds: the newest end (or write) seen among them


def _job_of(run_dir: Path) -> str | None:
    try:
        job = json.loads((run_dir / "worker_config.json").read_text()).get("job_id")
    except (OSError, ValueError, AttributeError):
        return None
    return job if isinstance(job, str) and job and "/" not in job and job not in (".", "..") else None


def _ended_at(run_dir: Path) -> float:
    """When the assignment ended here; without the marker (an agent killed mid-run), the last
    write to its directory's files."""
    marker = run_dir / ENDED_MARK
    if marker.exists():
        return marker.stat().st_mtime
    times = [p.stat().st_mtime for p in run_dir.iterdir() if p.is_file()]
    return max(times, default=run_dir.stat().st_mtime)


def job_dirs(work_dir: Path) -> dict[str, JobDirs]:
    jobs: dict[str, JobDirs] = {}
    assignments = work_dir / "assignments"
    if assignments.is_dir():
        for run_dir in assignments.iterdir():
            if not run_dir.is_dir() or run_dir.is_symlink() or (job := _job_of(run_dir)) is None:
                continue
            entry = jobs.setdefault(job, JobDirs())
            entry.run_dirs.append(run_dir)
            entry.last_at = max(entry.last_at, _ended_at(run_dir))
    checkpoints = work_dir / "checkpoints"
    if checkpoints.is_dir():
        for d in checkpoints.iterdir():
            if d.is_dir() and not d.is_symlink():
                entry = jobs.setdefault(d.name, JobDirs())
                entry.checkpoints = d
                entry.last_at = max(entry.last_at, d.stat().st_mtime)
    return jobs


def expired(jobs: dict[str, JobDirs], live: Collection[str], retention_s: float, now: float) -> list[str]:
    """The jobs whose directories go: none of their tasks runs here, and the last ended more than
    ``retention_s`` ago."""
    return sorted(j for j, d in jobs.items() if j not in live and now - d.last_at > retention_s)


def clean(work_dir: Path, live: Collection[str], retention_s: float, now: float) -> list[str]:
    """Delete the expired jobs' run dirs and checkpoints; return those jobs."""
    gone, trash = take_expired(work_dir, live, retention_s, now)
    remove(trash)
    return gone


def take_expired(
    work_dir: Path, live: Collection[str], retention_s: float, now: float
) -> tuple[list[str], list[Path]]:
    """Move the expired jobs' directories out of sight (a rename: quick, so the caller can do it
    where no task of the job can start meanwhile); ``remove`` deletes them after."""
    jobs = job_dirs(work_dir)
    gone = expired(jobs, live, retention_s, now)
    trash_root = work_dir / TRASH
    trash = []
    for job in gone:
        d = jobs[job]
        for path in [*d.run_dirs, *([d.checkpoints] if d.checkpoints else [])]:
            trash_root.mkdir(parents=True, exist_ok=True)
            target = trash_root / uuid.uuid4().hex
            try:
                path.rename(target)
            except OSError as exc:
                log.warning("job %s: could not remove %s: %s", job, path, exc)
                continue
            trash.append(target)
        log.info("job %s: its checkpoints and run dirs go (retention over)", job)
    return gone, trash


def remove(paths: list[Path]) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)
