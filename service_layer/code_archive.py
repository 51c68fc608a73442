"""Packing a code directory into the tar.gz a job runs from (``cpn jobs submit --code DIR``).

Deterministic: files in sorted order, every mtime 0, owner 0:0 without names, modes 0644/0755,
gzip without a name or time; so the same tree gives the same bytes, hence the same digest, and
an unchanged directory is not uploaded twice. Only regular files go in (a symlink to a file inside
the directory is stored as that file; a symlinked directory is skipped; a link pointing outside is
refused), and no member may be absolute or climb out with ``..``.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

from contracts.artifacts import MAX_CODE_BYTES

DEFAULT_EXCLUDES = (
    ".git",
    ".hg",
    ".svn",
    "__pycache__",
    "*.pyc",
    "*.pyo",
    ".venv",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    ".DS_Store",
    "*.egg-info",
)
REQUIREMENTS = "requirements.txt"
MAX_MEMBERS = 100_000


class ArchiveError(Exception):
    """The directory or archive cannot be used as a job's code; the message says why."""


@dataclass(frozen=True)
class PackedCode:
    path: Path
    digest: str
    bytes: int
    files: int
    requirements_digest: str | None


def check_member_name(name: str) -> str:
    """A safe relative member name, or ArchiveError naming it."""
    path = PurePosixPath(name)
    if not name or name.startswith("/") or "\\" in name or path.is_absolute() or ".." in path.parts:
        raise ArchiveError(f"archive member {name[:200]!r} is absolute or climbs out of the archive's root")
    if "\x00" in name or len(name) > 4096:
        raise ArchiveError(f"archive member {name[:200]!r} has an unusable name")
    return name


def _excluded(rel: PurePosixPath, patterns: Sequence[str]) -> bool:
    text = rel.as_posix()
    return any(fnmatch(text, p) or any(fnmatch(part, p) for part in rel.parts) for p in patterns)


def _included(rel: PurePosixPath, patterns: Sequence[str]) -> bool:
    return not patterns or any(fnmatch(rel.as_posix(), p) or fnmatch(rel.name, p) for p in patterns)


def code_files(
    root: Path, include: Sequence[str] = (), exclude: Sequence[str] = ()
) -> Iterator[tuple[str, Path]]:
    """``(member name, file to read)`` for every file that goes in, in sorted order: those matching
    ``include`` (all when empty), less ``DEFAULT_EXCLUDES`` and ``exclude``. A pattern matches a
    member's relative path or any one of its parts (``pkg`` leaves out the whole directory)."""
    root = root.resolve()
    exclude = (*DEFAULT_EXCLUDES, *exclude)
    if not root.is_dir():
        raise ArchiveError(f"{root} is not a directory")

    def walk(directory: Path, rel: PurePosixPath) -> Iterator[tuple[str, Path]]:
        for entry in sorted(os.scandir(directory), key=lambda e: e.name):
            member = rel / entry.name
            if _excluded(member, exclude):
                continue
            path = Path(entry.path)
            if entry.is_symlink():
                target = path.resolve()
                if not target.is_relative_to(root):
                    raise ArchiveError(f"{member}: a symlink pointing outside {root} (to {target})")
                if target.is_file() and _included(member, include):
                    yield check_member_name(member.as_posix()), target
                continue  # a symlinked directory: its files are in the tree already
            if entry.is_dir():
                yield from walk(path, member)
            elif entry.is_file() and _included(member, include):
                yield check_member_name(member.as_posix()), path

    return walk(root, PurePosixPath())


class _Capped(io.RawIOBase):
    """Counts what is written to ``out``; ArchiveError past ``max_bytes``."""

    def __init__(self, out: BinaryIO, max_bytes: int, sha: Any) -> None:
        self.out, self.max_bytes, self.sha, self.written = out, max_bytes, sha, 0

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.written += len(data)
        if self.written > self.max_bytes:
            raise ArchiveError(
                f"the packed code is over {self.max_bytes // 2**20} MiB (MAX_CODE_BYTES); leave out "
                "data and build outputs with --exclude, or put data in the artifact store"
            )
        self.sha.update(data)
        return self.out.write(data)


def _tarinfo(name: str, path: Path) -> tarfile.TarInfo:
    st = path.stat()
    info = tarfile.TarInfo(name)
    info.size = st.st_size
    info.mode = 0o755 if st.st_mode & 0o100 else 0o644
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    return info


def pack_code(
    root: Path,
    dest: Path,
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    max_bytes: int = MAX_CODE_BYTES,
) -> PackedCode:
    """Pack ``root`` into ``dest`` (a .tar.gz; see ``code_files`` for which files); raise
    ArchiveError naming what is wrong."""
    sha, files, req_digest = hashlib.sha256(), 0, None
    with dest.open("wb") as out:
        capped = _Capped(out, max_bytes, sha)
        with (
            gzip.GzipFile(filename="", mode="wb", fileobj=capped, mtime=0, compresslevel=6) as gz,  # type: ignore[arg-type]
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,  # type: ignore[arg-type]
        ):
            for name, path in code_files(root, include, exclude):
                files += 1
                if files > MAX_MEMBERS:
                    raise ArchiveError(f"more than {MAX_MEMBERS} files; leave some out with --exclude")
                with path.open("rb") as f:
                    tar.addfile(_tarinfo(name, path), f)
                if name == REQUIREMENTS:  # the environment the agent builds: what the archive holds
                    req_digest = "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    if files == 0:
        raise ArchiveError(f"no files to pack in {root} (check --include/--exclude)")
    return PackedCode(dest, "sha256:" + sha.hexdigest(), capped.written, files, req_digest)


def check_archive(path: Path, max_bytes: int = MAX_CODE_BYTES) -> PackedCode:
    """A ready-made .tar.gz given as the code: within the cap, readable, every member a regular
    file or directory with a safe name. Returns it described (``requirements_digest`` from its
    top-level requirements.txt)."""
    size = path.stat().st_size
    if size > max_bytes:
        raise ArchiveError(f"{path} is {size} bytes, over the code limit of {max_bytes} (MAX_CODE_BYTES)")
    sha, files, req_digest = hashlib.sha256(), 0, None
    try:
        with tarfile.open(path, mode="r:gz") as tar:
            for member in tar:
                check_member_name(member.name.removeprefix("./"))
                if not (member.isfile() or member.isdir()):
                    raise ArchiveError(
                        f"archive member {member.name!r} is a link or device; only files go in"
                    )
                files += 1
                if files > MAX_MEMBERS:
                    raise ArchiveError(f"more than {MAX_MEMBERS} members")
                if member.isfile() and member.name.removeprefix("./") == REQUIREMENTS:
                    data = tar.extractfile(member)
                    req_digest = "sha256:" + hashlib.sha256(data.read() if data else b"").hexdigest()
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ArchiveError(f"{path} is not a readable .tar.gz: {exc}") from None
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            sha.update(chunk)
    return PackedCode(path, "sha256:" + sha.hexdigest(), size, files, req_digest)
