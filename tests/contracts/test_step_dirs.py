"""A checkpoint step directory is removed as a whole: out of the ``step_*`` names before any of
its files goes, so a reader listing complete steps never finds one half deleted."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from contracts import step_dirs
from contracts.step_dirs import remove_step_dir


def _step(root: Path, n: int) -> Path:
    d = root / f"step_{n:08d}"
    d.mkdir(parents=True)
    for name in (".metadata", "__0_0.distcp", "meta.pt", "COMPLETE"):
        (d / name).write_bytes(b"x")
    return d


def test_the_step_leaves_its_name_before_any_file_is_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    step = _step(tmp_path, 60)
    kept = _step(tmp_path, 70)
    seen: list[tuple[Path, bool, list[str]]] = []
    real = shutil.rmtree

    def watching(path: Any, ignore_errors: bool = False) -> None:
        listed = sorted(p.name for p in tmp_path.glob("step_*") if (p / "COMPLETE").is_file())
        seen.append((Path(path), step.exists(), listed))
        real(path, ignore_errors=ignore_errors)

    monkeypatch.setattr(step_dirs.shutil, "rmtree", watching)
    remove_step_dir(step)
    assert not step.exists() and kept.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == [kept.name]  # nothing left behind
    # The delete that took the files ran on the renamed directory, once the step was no longer
    # listed: only the kept step was.
    path, step_there, listed = seen[-1]
    assert path.name.startswith(".removing-") and not step_there and listed == [kept.name], seen


def test_a_step_already_gone_or_a_leftover_from_a_killed_delete_is_no_error(tmp_path: Path) -> None:
    remove_step_dir(tmp_path / "step_00000010")  # never there
    step = _step(tmp_path, 20)
    leftover = tmp_path / f".removing-{step.name}"
    leftover.mkdir()
    (leftover / "partial").write_bytes(b"x")
    remove_step_dir(step)
    assert list(tmp_path.iterdir()) == []
