"""Bringing one blob to the node: a signed or user URL streamed into the node's cache by digest.

The cache (``<work_dir>/cache/blobs/<hex>``) is shared by every job on the node. A download goes
to ``<hex>.partial`` and resumes with ``Range`` after a dropped connection; the bytes are checked
against the digest before the blob takes its final name, so a name in the cache is always a
verified blob. A ``file://`` source is read where it lies (no copy).

Locks (``fcntl.flock``, so they hold across the agent's threads and processes): ``<hex>.fetch``
while a blob is being brought (a second task wanting it waits, then finds it there), ``<hex>.use``
shared while a task uses it; eviction takes both without waiting and skips a blob it cannot.

Blocking code: the agent runs it in a thread (``asyncio.to_thread``).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

import httpx

from contracts.artifacts import DIGEST_RE, MAX_ARTIFACT_BYTES, DataUri, parse_uri
from contracts.errors import InvalidArgument

CHUNK = 1 << 20
PROGRESS_EVERY_S = 1.0
MAX_ATTEMPTS = 8  # connections tried for one blob before giving up
BACKOFF_MIN_S, BACKOFF_MAX_S = 0.2, 10.0

Progress = Callable[[int, int | None], None]  # (bytes so far, bytes expected or None)


class FetchError(Exception):
    """A blob could not be brought (its message says why, for the task's status)."""


class Cancelled(Exception):
    """The task was stopped while its blob was being brought."""


@dataclass(frozen=True)
class Fetched:
    path: Path
    digest: str | None  # sha256:<hex> of the bytes (None: a file:// source given none)
    bytes: int
    seconds: float
    cache_hit: bool
    source: str  # "cache" | "http" | "file"

    def figures(self) -> dict[str, object]:
        """What the task's result reports for this item (staging estimate against actuals)."""
        return {
            "bytes": self.bytes,
            "seconds": round(self.seconds, 6),
            "cache_hit": self.cache_hit,
            "source": self.source,
            "digest": self.digest,
        }


def blobs_dir(work_dir: Path) -> Path:
    return work_dir / "cache" / "blobs"


def _hex(digest: str) -> str:
    return digest.removeprefix("sha256:")


def _lock(path: Path, mode: int) -> IO[bytes]:
    """Open ``path`` and flock it (``mode``); the lock lasts as long as the returned file."""
    f = open(path, "ab")  # noqa: SIM115 - held by the caller
    try:
        fcntl.flock(f, mode)
    except BaseException:
        f.close()
        raise
    return f


class BlobUse:
    """A task's hold on the blobs it staged: eviction skips them until ``release``."""

    def __init__(self) -> None:
        self._files: list[IO[bytes]] = []

    def hold(self, lock_path: Path) -> None:
        self._files.append(_lock(lock_path, fcntl.LOCK_SH))

    def release(self) -> None:
        for f in self._files:
            f.close()
        self._files.clear()


class _Meter:
    """Progress at most once a second; checks for cancellation on every chunk."""

    def __init__(self, progress: Progress | None, total: int | None, cancel: threading.Event | None) -> None:
        self.progress, self.total, self.cancel = progress, total, cancel
        self.last = 0.0

    def tick(self, done: int, force: bool = False) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled("stopped while staging")
        now = time.monotonic()
        if self.progress is not None and (force or now - self.last >= PROGRESS_EVERY_S):
            self.last = now
            self.progress(done, self.total)


def _check_digest(digest: str | None) -> None:
    if digest is not None and not DIGEST_RE.match(digest):
        raise FetchError(f"stage item digest {digest[:80]!r} is not sha256:<64 hex digits>")


def _plain_from(url: str, hosts: frozenset[str]) -> DataUri | None:
    """A plain-http URL to one of ``hosts``: the control plane, where the agent's own channel to it
    is plaintext too (no ``--tls-ca-file``), so its artifact URLs are no less safe than its orders."""
    parts = urlsplit(url) if url.startswith("http://") else None
    return DataUri("http", url=url) if parts is not None and parts.hostname in hosts else None


def fetch(
    url: str,
    *,
    work_dir: Path,
    digest: str | None = None,
    expected_bytes: int | None = None,
    max_bytes: int = MAX_ARTIFACT_BYTES,
    use: BlobUse | None = None,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
    cache_max_bytes: int | None = None,
    client: httpx.Client | None = None,
    timeout_s: float = 60.0,
    verify: ssl.SSLContext | bool = True,
    plain_http_hosts: frozenset[str] = frozenset(),
    attempts: int = MAX_ATTEMPTS,
) -> Fetched:
    """The blob at ``url`` on this node, verified against ``digest`` where given, its size bounded
    by ``expected_bytes`` (where known) and ``max_bytes``. A cached blob of that digest is used
    without touching the network. ``use`` keeps the blob from eviction until released.
    ``attempts``: connections tried before giving up."""
    _check_digest(digest)
    limit = min(max_bytes, expected_bytes) if expected_bytes is not None else max_bytes
    try:
        uri = _plain_from(url, plain_http_hosts) or parse_uri(url, "stage.url")
    except InvalidArgument as exc:
        raise FetchError(exc.message) from None
    if uri.scheme == "file":
        return _local(Path(uri.path or ""), digest, limit, progress, cancel)
    if uri.scheme not in ("http", "https"):
        raise FetchError(f"stage.url: the agent fetches http(s) and file:// URLs, not {uri.scheme}://")
    root = blobs_dir(work_dir)
    root.mkdir(parents=True, exist_ok=True)
    # A source without a digest is cached by its URL (taken as immutable; give a digest to have
    # the bytes checked), under a name no digest can take.
    key = _hex(digest) if digest else "url-" + hashlib.sha256(url.encode()).hexdigest()
    final = root / key
    started = time.monotonic()
    with _lock(root / f"{key}.fetch", fcntl.LOCK_EX):
        if final.is_file():
            size = final.stat().st_size
            os.utime(final)  # last use, for LRU eviction
            if use is not None:
                use.hold(root / f"{key}.use")
            # A blob cached by its URL is not hashed again (it could be large): no digest to report.
            return Fetched(final, digest, size, time.monotonic() - started, True, "cache")
        partial = root / f"{key}.partial"
        got = _download(
            url, partial, limit, expected_bytes, progress, cancel, client, timeout_s, verify, attempts
        )
        if digest is not None and got != digest:
            (root / f"{key}.partial").unlink(missing_ok=True)
            raise FetchError(f"digest mismatch for {_redact(url)}: expected {digest}, got {got}; deleted")
        os.replace(root / f"{key}.partial", final)
        if use is not None:
            use.hold(root / f"{key}.use")
        size = final.stat().st_size
    if cache_max_bytes is not None:
        evict(work_dir, cache_max_bytes, keep=final)
    return Fetched(final, got, size, time.monotonic() - started, False, "http")


def _redact(url: str) -> str:
    """The URL without its query (a ticket or a presigned signature is no message's business)."""
    return url.split("?", 1)[0][:300]


def _file_digest(path: Path, cancel: threading.Event | None = None, meter: _Meter | None = None) -> str:
    h = hashlib.sha256()
    done = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            done += len(chunk)
            if meter is not None:
                meter.tick(done)
    return "sha256:" + h.hexdigest()


def _local(
    path: Path, digest: str | None, limit: int, progress: Progress | None, cancel: threading.Event | None
) -> Fetched:
    started = time.monotonic()
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise FetchError(f"stage.url file://{path}: {exc.strerror or exc}") from None
    if not path.is_file():
        raise FetchError(f"stage.url file://{path}: not a regular file")
    if size > limit:
        raise FetchError(f"stage.url file://{path}: {size} bytes, over the bound of {limit}")
    seen = None
    if digest is not None:
        seen = _file_digest(path, cancel, _Meter(progress, size, cancel))
        if seen != digest:
            raise FetchError(f"digest mismatch for file://{path}: expected {digest}, got {seen}")
    return Fetched(path, seen, size, time.monotonic() - started, False, "file")


def _download(
    url: str,
    partial: Path,
    limit: int,
    expected: int | None,
    progress: Progress | None,
    cancel: threading.Event | None,
    client: httpx.Client | None,
    timeout_s: float,
    verify: ssl.SSLContext | bool = True,
    attempts: int = MAX_ATTEMPTS,
) -> str:
    """Stream ``url`` into ``partial``, resuming what an earlier try (or an earlier agent) left
    there; return the digest of the whole. Retries dropped connections and 5xx answers with a
    capped backoff; a 4xx answer (a refused ticket, a missing blob) fails at once."""
    own = client is None
    http = client or httpx.Client(follow_redirects=True, timeout=timeout_s, verify=verify)
    meter = _Meter(progress, expected, cancel)
    backoff, last_error = BACKOFF_MIN_S, ""
    try:
        for attempt in range(attempts):
            have = partial.stat().st_size if partial.exists() else 0
            if have > limit:
                partial.unlink()
                have = 0
            headers = {"Range": f"bytes={have}-"} if have else {}
            try:
                with http.stream("GET", url, headers=headers) as r:
                    if r.status_code == 416 and have:
                        if expected == have:
                            return _file_digest(partial)  # the whole blob was already here
                        partial.unlink()  # more than the blob holds: not a prefix of it
                        continue
                    if r.status_code >= 400:
                        r.read()
                        msg = f"GET {_redact(url)}: HTTP {r.status_code} {r.text[:300]}".rstrip()
                        if r.status_code < 500:
                            raise FetchError(msg)
                        raise httpx.TransportError(msg)
                    if r.status_code != 206 or not r.headers.get("content-range", "").startswith(
                        f"bytes {have}-"
                    ):
                        have = 0  # the server sent the whole blob: start afresh
                    total = _announced_total(r, have)
                    if total is not None and total > limit:
                        raise FetchError(f"GET {_redact(url)}: {total} bytes, over the bound of {limit}")
                    if meter.total is None:
                        meter.total = total
                    h = hashlib.sha256()
                    with open(partial, "r+b" if have else "wb") as out:
                        if have:  # the kept prefix is part of the digest
                            while chunk := out.read(CHUNK):
                                h.update(chunk)
                            out.seek(have)
                            out.truncate()
                        done = have
                        meter.tick(done, force=True)
                        for chunk in r.iter_bytes(CHUNK):
                            done += len(chunk)
                            if done > limit:
                                raise FetchError(f"GET {_redact(url)}: more than the bound of {limit} bytes")
                            out.write(chunk)
                            h.update(chunk)
                            meter.tick(done)
                        meter.tick(done, force=True)
                    return "sha256:" + h.hexdigest()
            except (httpx.TransportError, httpx.StreamError) as exc:
                last_error = str(exc) or type(exc).__name__
            if attempt + 1 == attempts:
                break
            if cancel is not None and cancel.wait(backoff):
                raise Cancelled("stopped while staging")
            elif cancel is None:
                time.sleep(backoff)
            backoff = min(BACKOFF_MAX_S, backoff * 2)
        raise FetchError(f"GET {_redact(url)}: gave up after {attempts} attempts: {last_error}")
    finally:
        if own:
            http.close()


def _announced_total(r: httpx.Response, have: int) -> int | None:
    """The blob's whole size from Content-Range (``bytes a-b/total``) or Content-Length."""
    content_range = r.headers.get("content-range", "")
    if r.status_code == 206 and "/" in content_range:
        tail = content_range.rsplit("/", 1)[1]
        return int(tail) if tail.isdigit() else None
    length = r.headers.get("content-length")
    return have + int(length) if length and length.isdigit() else None


def evict(work_dir: Path, max_bytes: int, keep: Path | None = None) -> list[Path]:
    """Delete the least recently used blobs not in use until the cache holds at most ``max_bytes``
    (``keep`` is never deleted). Returns what was deleted."""
    root = blobs_dir(work_dir)
    if not root.is_dir():
        return []
    blobs = []
    for p in root.iterdir():
        if p.suffix in (".fetch", ".use", ".partial") or not p.is_file():
            continue
        st = p.stat()
        blobs.append((st.st_mtime, st.st_size, p))
    total = sum(size for _, size, _ in blobs)
    deleted = []
    for _, size, path in sorted(blobs):
        if total <= max_bytes:
            break
        if keep is not None and path == keep:
            continue
        fetching = open(root / f"{path.name}.fetch", "ab")  # noqa: SIM115
        using = open(root / f"{path.name}.use", "ab")  # noqa: SIM115
        try:
            fcntl.flock(fetching, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(using, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # being brought or in use
        else:
            path.unlink(missing_ok=True)
            total -= size
            deleted.append(path)
        finally:
            using.close()
            fetching.close()
    return deleted
