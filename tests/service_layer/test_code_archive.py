"""Packing a code directory: deterministic, bounded, and nothing escapes its root."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from pathlib import Path

import pytest

from service_layer.code_archive import ArchiveError, check_archive, check_member_name, pack_code


def make_tree(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text("def build(cfg):\n    return cfg\n")
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "model.py").write_text("WIDTH = 64\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    (root / "requirements.txt").write_text("numpy\n")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / "pkg" / "__pycache__").mkdir()
    (root / "pkg" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0" * 10)
    (root / "notes.pyc").write_bytes(b"x")
    return root


def members(path: Path) -> list[tuple[str, int, int, int, str]]:
    with tarfile.open(path, "r:gz") as tar:
        return [(m.name, m.mode, m.mtime, m.uid, m.uname) for m in tar]


def test_the_same_tree_gives_the_same_digest(tmp_path: Path) -> None:
    a = make_tree(tmp_path / "a")
    b = make_tree(tmp_path / "b")
    os.utime(b / "train.py", (1_000_000, 1_000_000))  # other times, other owners' names: same bytes
    one = pack_code(a, tmp_path / "a.tar.gz")
    two = pack_code(b, tmp_path / "b.tar.gz")
    assert one.digest == two.digest and one.bytes == two.bytes
    assert one.digest == "sha256:" + hashlib.sha256((tmp_path / "a.tar.gz").read_bytes()).hexdigest()
    assert [m[0] for m in members(one.path)] == [
        "pkg/__init__.py",
        "pkg/model.py",
        "requirements.txt",
        "run.sh",
        "train.py",
    ]  # sorted; .git, __pycache__ and *.pyc left out
    modes = {name: mode for name, mode, *_ in members(one.path)}
    assert modes["run.sh"] == 0o755 and modes["train.py"] == 0o644
    assert {(mtime, uid, uname) for _, _, mtime, uid, uname in members(one.path)} == {(0, 0, "")}
    assert one.requirements_digest == "sha256:" + hashlib.sha256(b"numpy\n").hexdigest()
    (b / "train.py").write_text("def build(cfg):\n    return None\n")
    assert pack_code(b, tmp_path / "c.tar.gz").digest != one.digest


def test_include_and_exclude(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "src")
    only_py = pack_code(root, tmp_path / "py.tar.gz", include=["*.py"])
    assert [m[0] for m in members(only_py.path)] == ["pkg/__init__.py", "pkg/model.py", "train.py"]
    assert only_py.requirements_digest is None  # not in the archive, so no environment from it
    no_pkg = pack_code(root, tmp_path / "nopkg.tar.gz", exclude=["pkg", "requirements.txt"])
    assert [m[0] for m in members(no_pkg.path)] == ["run.sh", "train.py"]
    assert no_pkg.requirements_digest is None
    with pytest.raises(ArchiveError, match="no files"):
        pack_code(root, tmp_path / "none.tar.gz", include=["*.rs"])


def test_too_large_code_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "src")
    (root / "data.bin").write_bytes(os.urandom(200_000))  # incompressible
    with pytest.raises(ArchiveError, match="over 0 MiB.*--exclude"):
        pack_code(root, tmp_path / "big.tar.gz", max_bytes=100_000)
    assert pack_code(root, tmp_path / "ok.tar.gz", exclude=["*.bin"], max_bytes=100_000).files == 5


def test_symlinks_inside_are_files_and_outside_are_refused(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "src")
    (root / "alias.py").symlink_to(root / "train.py")
    (root / "pkg_link").symlink_to(root / "pkg", target_is_directory=True)
    packed = pack_code(root, tmp_path / "in.tar.gz")
    names = [m[0] for m in members(packed.path)]
    assert "alias.py" in names and not any(n.startswith("pkg_link") for n in names)
    with tarfile.open(packed.path, "r:gz") as tar:
        alias = tar.getmember("alias.py")
        assert alias.isfile() and tar.extractfile(alias).read() == (root / "train.py").read_bytes()  # type: ignore[union-attr]
    (tmp_path / "secret").write_text("key")
    (root / "leak").symlink_to(tmp_path / "secret")
    with pytest.raises(ArchiveError, match="leak: a symlink pointing outside"):
        pack_code(root, tmp_path / "out.tar.gz")


def _tar_with(tmp_path: Path, name: str, kind: bytes = tarfile.REGTYPE) -> Path:
    path = tmp_path / "given.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo(name)
        info.type = kind
        if kind == tarfile.SYMTYPE:
            info.linkname = "/etc/passwd"
            tar.addfile(info)
        else:
            info.size = 2
            tar.addfile(info, io.BytesIO(b"hi"))
    return path


@pytest.mark.parametrize("name", ["../evil.py", "/etc/cron.d/x", "pkg/../../evil.py", "a\\..\\b"])
def test_archive_members_escaping_the_root_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(ArchiveError, match="absolute or climbs out"):
        check_archive(_tar_with(tmp_path, name))
    with pytest.raises(ArchiveError):
        check_member_name(name)


def test_a_ready_archive_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ArchiveError, match="link or device"):
        check_archive(_tar_with(tmp_path, "link", tarfile.SYMTYPE))
    good = _tar_with(tmp_path, "./train.py")
    assert check_archive(good).files == 1
    with pytest.raises(ArchiveError, match="over the code limit"):
        check_archive(good, max_bytes=10)
    (tmp_path / "not.tar.gz").write_text("plain text")
    with pytest.raises(ArchiveError, match="not a readable"):
        check_archive(tmp_path / "not.tar.gz")
