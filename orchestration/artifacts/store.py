"""The artifact store's interface: content-addressed blobs, written as streams and read as ranges.

A blob is written through a ``BlobWriter``: bytes go to a temporary object while their SHA-256 is
computed, and ``commit`` files them under ``sha256:<hex>`` (a blob already there is kept, so writing
the same bytes twice is harmless). No backend holds a whole blob in memory: writes are buffered at
most ``part_bytes``, reads come back in chunks of at most ``chunk_bytes``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from contracts.artifacts import MAX_ARTIFACT_BYTES, check_digest
from contracts.errors import InvalidArgument, PayloadTooLarge

CHUNK_BYTES = 1024 * 1024  # a read's chunk, a stream's write
PRESIGN_TTL_S = 3600


@dataclass(frozen=True)
class Stored:
    digest: str
    bytes: int
    created: bool  # False: the blob was already in the store


@dataclass(frozen=True)
class BlobInfo:
    digest: str
    bytes: int
    modified_at: datetime


class Digesting:
    """Counts and hashes what passes; refuses a stream over ``max_bytes`` as it arrives."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._sha = hashlib.sha256()

    def take(self, data: bytes) -> None:
        if self.bytes + len(data) > self.max_bytes:
            raise PayloadTooLarge(
                f"the body passes the limit of {self.max_bytes} bytes", limit_bytes=self.max_bytes
            )
        self.bytes += len(data)
        self._sha.update(data)

    @property
    def digest(self) -> str:
        return "sha256:" + self._sha.hexdigest()

    def check(self, expected: str | None) -> str:
        """The digest, after checking it against ``expected`` (InvalidArgument naming ``digest``)."""
        if expected is not None and expected != self.digest:
            raise InvalidArgument(
                f"digest: the body's SHA-256 is {self.digest}, not {expected}",
                field="digest",
                expected=expected,
                actual=self.digest,
            )
        return self.digest


class BlobWriter(Protocol):
    @property
    def bytes(self) -> int: ...

    def write(self, data: bytes) -> None:
        """Append; PayloadTooLarge once past the writer's max_bytes (then ``abort``)."""

    def commit(self, expected_digest: str | None = None) -> Stored:
        """File the bytes under their digest; a mismatch with ``expected_digest`` raises
        InvalidArgument and stores nothing. The writer is spent either way."""

    def abort(self) -> None:
        """Drop what was written (idempotent; also after a failed commit)."""


class ArtifactStore(Protocol):
    """One backend: ``local.LocalStore`` (a directory) or ``s3.S3Store`` (a bucket)."""

    kind: str  # "embedded" | "s3"
    chunk_bytes: int

    def begin(self, max_bytes: int = MAX_ARTIFACT_BYTES) -> BlobWriter: ...

    def size(self, digest: str) -> int | None:
        """The blob's length, None when absent."""

    def open(self, digest: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        """Bytes ``start`` to ``end`` inclusive (None: to the last) in chunks of at most
        ``chunk_bytes``; NotFound when absent."""

    def delete(self, digest: str) -> bool:
        """Remove the blob; False when it was not there."""

    def blobs(self) -> Iterator[BlobInfo]:
        """Every stored blob (for the retention sweep)."""

    def stale_uploads(self, older_than: datetime) -> int:
        """Drop temporary objects of writes begun before ``older_than`` that never finished."""

    def presign_get(self, digest: str, ttl_s: int = PRESIGN_TTL_S) -> str | None:
        """A URL anyone may GET the blob from until it expires; None: the backend has none."""

    def presign_external(self, bucket: str, key: str, ttl_s: int = PRESIGN_TTL_S) -> str | None:
        """A presigned GET of ``s3://bucket/key`` with the store's credentials; None: no S3."""


def exists(store: ArtifactStore, digest: str) -> bool:
    return store.size(digest) is not None


def put(
    store: ArtifactStore,
    chunks: Iterable[bytes],
    *,
    expected_digest: str | None = None,
    max_bytes: int = MAX_ARTIFACT_BYTES,
) -> Stored:
    """Write a stream of chunks as one blob (see ``BlobWriter``)."""
    if expected_digest is not None:
        check_digest(expected_digest)
    writer = store.begin(max_bytes)
    try:
        for chunk in chunks:
            writer.write(chunk)
        return writer.commit(expected_digest)
    finally:
        writer.abort()


def blob_key(digest: str) -> str:
    """``sha256/ab/<hex>``: the blob's path under the store's root (or prefix)."""
    hexdigest = check_digest(digest).removeprefix("sha256:")
    return f"sha256/{hexdigest[:2]}/{hexdigest}"
