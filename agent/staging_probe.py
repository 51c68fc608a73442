"""What staging costs on this node and what its cache holds, for the control plane's quotes.

After registering, the agent fetches the store probe's blobs (``RegisterResponse.store_probe``)
with the very ``fetch`` a task's staging uses: a new HTTP client and connection, the ticket
checked, the blob streamed into a cache, hashed and renamed. The small blob's fetches are all
fixed cost; the bulk blob's bytes beyond the small one's, over its seconds beyond them, are the
store's rate to this node. A venv built as a task's is (``code_env.measure_build``, in the agent's
measuring turn) gives the build's CPU seconds. The cache report lists the blobs and venvs a task
would find here without fetching or building, most recently used first.

Blocking code: the agent runs it in a thread.
"""

from __future__ import annotations

import logging
import shutil
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from agent import code_env
from agent.fetch import FetchError, blobs_dir, fetch
from agent.settings import AgentSettings
from agent.tls import http_verify, plain_http_hosts
from contracts.artifacts import DIGEST_RE
from contracts.node_staging import MAX_CACHE_ENTRIES, MAX_ERROR_CHARS, StagingProbe

log = logging.getLogger(__name__)

SMALL_FETCHES = 3  # the fixed cost is their median (after one that warms the HTTP client up)
PROBE_TIMEOUT_S = 30.0  # per connection and read: a store this slow to answer is not measured


@dataclass(frozen=True)
class ProbeBlob:
    url: str
    digest: str
    bytes: int


def probe_store(blobs: Sequence[ProbeBlob], work_dir: Path, settings: AgentSettings) -> StagingProbe:
    """Fixed seconds per fetch and bytes/s from the store to this node; the error where it failed."""
    if len(blobs) < 2 or blobs[-1].bytes <= blobs[0].bytes:
        return StagingProbe(error="the store probe needs a small blob and a larger one")
    small, bulk = blobs[0], blobs[-1]
    scratch = work_dir / "cache" / "probe"  # a cache of its own: the node's stays as it was

    def fetch_once(b: ProbeBlob) -> float:
        shutil.rmtree(scratch, ignore_errors=True)
        got = fetch(
            b.url,
            work_dir=scratch,
            digest=b.digest,
            expected_bytes=b.bytes,
            max_bytes=b.bytes,
            timeout_s=PROBE_TIMEOUT_S,
            verify=http_verify(settings.tls_ca_file),
            plain_http_hosts=plain_http_hosts(settings.server, settings.tls_ca_file),
            attempts=1,
        )
        return got.seconds

    try:
        fetch_once(small)  # the agent's first fetch also pays one-time imports and TLS set-up
        small_s = statistics.median(fetch_once(small) for _ in range(SMALL_FETCHES))
        bulk_s = fetch_once(bulk)
    except Exception as exc:  # whatever failed, the node is then priced without the figures
        why = str(exc) if isinstance(exc, FetchError | OSError) else f"{type(exc).__name__}: {exc}"
        return StagingProbe(error=f"store probe failed: {why}"[:MAX_ERROR_CHARS])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    extra_s = bulk_s - small_s
    rate = (bulk.bytes - small.bytes) / extra_s if extra_s > 0 else bulk.bytes / bulk_s
    return StagingProbe(
        fetch_fixed_s=max(0.0, small_s - small.bytes / rate), bytes_per_s=rate, probe_bytes=bulk.bytes
    )


def measure_venv(work_dir: Path, settings: AgentSettings) -> float:
    """CPU seconds of one venv build with nothing to install (0.0 where it fails: not measured)."""
    try:
        return code_env.measure_build(work_dir, pip_args=settings.pip_args)
    except Exception:  # a build that fails here fails a task's too, which says why
        log.warning("the venv build could not be measured", exc_info=True)
        return 0.0


def cache_listing(work_dir: Path, limit: int = MAX_CACHE_ENTRIES) -> tuple[list[str], list[str]]:
    """(blobs, venvs) the node's cache holds, by digest, most recently used first."""
    blobs = []
    root = blobs_dir(work_dir)
    for path in root.iterdir() if root.is_dir() else ():
        digest = "sha256:" + path.name
        if DIGEST_RE.match(digest):  # a complete blob (partial and lock files have suffixes)
            try:
                blobs.append((path.stat().st_mtime, digest))
            except FileNotFoundError:  # evicted meanwhile
                continue
    venvs = code_env.complete_venvs(work_dir)
    return (
        [d for _, d in sorted(blobs, reverse=True)[:limit]],
        [d for _, d in sorted(venvs, reverse=True)[:limit]],
    )
