"""The embedded store: blobs as files under ``<root>/sha256/ab/<hex>``, written to ``<root>/tmp``
first and renamed into place (atomic on one file system), so a reader never sees half a blob."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from contracts.artifacts import DIGEST_RE, MAX_ARTIFACT_BYTES
from contracts.errors import NotFound
from orchestration.artifacts.store import CHUNK_BYTES, PRESIGN_TTL_S, BlobInfo, Digesting, Stored, blob_key


class _FileWriter:
    def __init__(self, store: LocalStore, max_bytes: int) -> None:
        self._store = store
        self._digesting = Digesting(max_bytes)
        store.tmp.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=store.tmp, prefix="up-")
        self._path = Path(name)
        self._file: BinaryIO = os.fdopen(fd, "wb")

    @property
    def bytes(self) -> int:
        return self._digesting.bytes

    def write(self, data: bytes) -> None:
        self._digesting.take(data)
        self._file.write(data)

    def commit(self, expected_digest: str | None = None) -> Stored:
        self._file.close()
        digest = self._digesting.check(expected_digest)
        final = self._store.path(digest)
        if final.exists():
            self.abort()
            return Stored(digest, self.bytes, created=False)
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self._path, final)
        return Stored(digest, self.bytes, created=True)

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self._file.close()
        self._path.unlink(missing_ok=True)


class LocalStore:
    kind = "embedded"

    def __init__(self, root: Path, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.root = Path(root)
        self.tmp = self.root / "tmp"
        self.chunk_bytes = chunk_bytes

    def path(self, digest: str) -> Path:
        return self.root / blob_key(digest)

    def begin(self, max_bytes: int = MAX_ARTIFACT_BYTES) -> _FileWriter:
        return _FileWriter(self, max_bytes)

    def size(self, digest: str) -> int | None:
        try:
            return self.path(digest).stat().st_size
        except FileNotFoundError:
            return None

    def open(self, digest: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        try:
            handle = self.path(digest).open("rb")
        except FileNotFoundError:
            raise NotFound(f"no blob {digest}", digest=digest) from None
        return self._read(handle, start, end)

    def _read(self, handle: BinaryIO, start: int, end: int | None) -> Iterator[bytes]:
        with handle:
            handle.seek(start)
            left = None if end is None else end - start + 1
            while left is None or left > 0:
                chunk = handle.read(self.chunk_bytes if left is None else min(left, self.chunk_bytes))
                if not chunk:
                    return
                if left is not None:
                    left -= len(chunk)
                yield chunk

    def delete(self, digest: str) -> bool:
        try:
            self.path(digest).unlink()
            return True
        except FileNotFoundError:
            return False

    def blobs(self) -> Iterator[BlobInfo]:
        base = self.root / "sha256"
        if not base.is_dir():
            return
        for prefix in sorted(base.iterdir()):
            for blob in sorted(prefix.iterdir()) if prefix.is_dir() else ():
                digest = f"sha256:{blob.name}"
                if not DIGEST_RE.match(digest):
                    continue
                with contextlib.suppress(FileNotFoundError):
                    st = blob.stat()
                    yield BlobInfo(digest, st.st_size, datetime.fromtimestamp(st.st_mtime, UTC))

    def stale_uploads(self, older_than: datetime) -> int:
        """Remove temporary files of uploads that never finished (a crashed server's); how many."""
        removed = 0
        for tmp in self.tmp.glob("up-*") if self.tmp.is_dir() else ():
            with contextlib.suppress(FileNotFoundError):
                if datetime.fromtimestamp(tmp.stat().st_mtime, UTC) < older_than:
                    tmp.unlink()
                    removed += 1
        return removed

    def presign_get(self, digest: str, ttl_s: int = PRESIGN_TTL_S) -> str | None:
        return None

    def presign_external(self, bucket: str, key: str, ttl_s: int = PRESIGN_TTL_S) -> str | None:
        return None
