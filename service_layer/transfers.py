"""Streaming file transfers for the client: hashing, uploads read from disk as they are sent, and
downloads that resume a partial file with ``Range`` and check the SHA-256 before keeping it."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path

CHUNK_BYTES = 1024 * 1024

Progress = Callable[[int, int], None]  # (bytes done, bytes in all)


class DigestMismatch(Exception):
    """A downloaded file's SHA-256 is not the artifact's (the partial file is removed)."""


def file_digest(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            sha.update(chunk)
    return "sha256:" + sha.hexdigest()


def read_chunks(path: Path, progress: Progress | None = None) -> Iterator[bytes]:
    total = path.stat().st_size
    done = 0
    with path.open("rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            done += len(chunk)
            if progress:
                progress(done, total)
            yield chunk


def partial_path(dest: Path) -> Path:
    return dest.with_name(dest.name + ".part")


def resume_from(part: Path, size: int) -> int:
    """Bytes of ``part`` to keep (0: start over, also when it is longer than the artifact)."""
    have = part.stat().st_size if part.exists() else 0
    if have > size:
        part.unlink()
        return 0
    return have


def finish(part: Path, dest: Path, digest: str) -> Path:
    """Keep ``part`` as ``dest`` if its SHA-256 is ``digest``; else remove it and raise."""
    got = file_digest(part)
    if got != digest:
        part.unlink(missing_ok=True)
        raise DigestMismatch(f"{dest.name}: downloaded bytes have {got}, expected {digest}")
    part.replace(dest)
    return dest


class ProgressLine:
    """``name: 12.0/40.0 MiB`` on stderr, rewritten in place at most every ``step`` bytes."""

    def __init__(self, name: str, write: Callable[[str], object], step: int = 8 * CHUNK_BYTES) -> None:
        self.name, self.write, self.step, self._shown = name, write, step, -1

    def __call__(self, done: int, total: int) -> None:
        if done < total and self._shown >= 0 and done - self._shown < self.step:
            return
        self._shown = done
        end = "\n" if done >= total else "\r"
        self.write(f"{self.name}: {done / 2**20:,.1f}/{total / 2**20:,.1f} MiB{end}")
