from __future__ import annotations

from pathlib import Path

from training.checkpoint import complete_checkpoints, latest_checkpoint, step_dir


def test_latest_ignores_interrupted_saves(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path / "none") is None
    for step, done in ((2, True), (4, True), (6, False)):
        d = step_dir(tmp_path, step)
        d.mkdir(parents=True)
        if done:
            (d / "COMPLETE").write_text(str(step))
    (tmp_path / "other").mkdir()
    assert [s for s, _ in complete_checkpoints(tmp_path)] == [2, 4]
    assert latest_checkpoint(tmp_path) == step_dir(tmp_path, 4)
    assert latest_checkpoint(tmp_path, at_most=3) == step_dir(tmp_path, 2)  # one step for every region
    assert latest_checkpoint(tmp_path, at_most=1) is None
