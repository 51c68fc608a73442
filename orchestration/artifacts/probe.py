"""The store probe's blobs: what an agent fetches after it registers to measure staging from this
store (``resource_layer``'s registration signs the URLs, ``agent/store_probe.py`` fetches).

Two blobs of fixed pseudo-random bytes (no transport compresses them): a small one, whose
fetches are all fixed cost, and a bulk one of ``link_probe_bytes`` (the link probes' size), whose
bytes beyond the small one's give the rate. The bytes follow from the size alone, so every replica
keeps the same blobs and the retention sweep is told to keep them (``digests``).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass

from orchestration.artifacts.store import ArtifactStore, put

SMALL_BYTES = 4096  # about a small code archive: its fetch is all connection, ticket and cache write
_CHUNK = 1 << 20


@dataclass(frozen=True)
class ProbeBlob:
    digest: str
    bytes: int


def _chunks(size: int) -> Iterator[bytes]:
    """``size`` bytes of SHAKE-256 output, a MiB at a time (each chunk seeded by the size and its index)."""
    for i, start in enumerate(range(0, size, _CHUNK)):
        yield hashlib.shake_256(b"cpn store probe|%d|%d" % (size, i)).digest(min(_CHUNK, size - start))


@functools.cache
def blob(size: int) -> ProbeBlob:
    h = hashlib.sha256()
    for chunk in _chunks(size):
        h.update(chunk)
    return ProbeBlob("sha256:" + h.hexdigest(), size)


def blobs(bulk_bytes: int) -> tuple[ProbeBlob, ProbeBlob]:
    """(small, bulk)."""
    return blob(SMALL_BYTES), blob(max(bulk_bytes, 2 * SMALL_BYTES))


def digests(bulk_bytes: int) -> set[str]:
    return {b.digest for b in blobs(bulk_bytes)}


def ensure(store: ArtifactStore, bulk_bytes: int) -> tuple[ProbeBlob, ProbeBlob]:
    """The probe's blobs, written to ``store`` where absent."""
    out = blobs(bulk_bytes)
    for b in out:
        if store.size(b.digest) is None:
            put(store, _chunks(b.bytes), expected_digest=b.digest, max_bytes=b.bytes)
    return out
