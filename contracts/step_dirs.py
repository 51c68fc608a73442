"""Removing a checkpoint's step directory as a whole, wherever one is kept (a worker's own
checkpoints, a node's copies): a reader that lists ``step_*`` directories with their marker must
never find one with some of its files already gone."""

from __future__ import annotations

import shutil
from pathlib import Path


def remove_step_dir(path: Path) -> None:
    """Rename ``path`` out of the ``step_*`` names (one atomic rename), then delete it. Gone
    already (another rank or process removed it): nothing to do."""
    trash = path.with_name(f".removing-{path.name}")  # one remover per directory
    shutil.rmtree(trash, ignore_errors=True)  # left by a process killed mid-delete
    try:
        path.rename(trash)
    except FileNotFoundError:
        return
    shutil.rmtree(trash, ignore_errors=True)
