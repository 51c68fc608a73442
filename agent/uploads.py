"""After a task's workers exit: its output files to the control plane's store, each with a signed
``put`` URL (``worker_config.stage.outputs``), streamed with its SHA-256 in ``X-Content-SHA256``.

Blocking code: the agent runs it in a thread.
"""

from __future__ import annotations

import hashlib
import re
import ssl
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from contracts.artifacts import CHECKPOINT_OUTPUT
from contracts.worker_config import OutputTarget

SHA256_HEADER = "X-Content-SHA256"
CHUNK = 1 << 20
MAX_ATTEMPTS = 5
BACKOFF_MIN_S, BACKOFF_MAX_S = 0.2, 10.0
_STEP_DIR = re.compile(r"^step_(\d+)$")
_DONE = "COMPLETE"  # training.checkpoint's marker of a complete save


class UploadError(Exception):
    """An output could not be uploaded (the message says which and why)."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def _chunks(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            yield chunk


def check_target(name: str, url: str, plain_http_hosts: frozenset[str]) -> None:
    """An output goes over https, or over plain http only to a control plane the agent already
    speaks to in plaintext (``agent.tls.plain_http_hosts``): a signed URL in the clear would hand
    its ticket and the model's bytes to anyone on the path."""
    parts = urlsplit(url)
    if parts.scheme == "https":
        return
    if parts.scheme == "http" and parts.hostname in plain_http_hosts:
        return
    raise UploadError(
        f"output {name}: refusing to upload to {parts.scheme}://{parts.hostname}: outputs go over https "
        "(or plain http only to a control plane this agent reaches without TLS); check CPN_PUBLIC_URL"
    )


def upload_file(
    path: Path,
    target: OutputTarget,
    *,
    timeout_s: float = 120.0,
    verify: ssl.SSLContext | bool = True,
    plain_http_hosts: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """PUT one file (streamed); retries dropped connections and 5xx answers, not 4xx ones.
    Returns {bytes, digest, seconds}."""
    size = path.stat().st_size
    name = path.name
    check_target(name, target.url, plain_http_hosts)
    if size > target.max_bytes:
        raise UploadError(f"output {name}: {size} bytes, over its bound of {target.max_bytes}")
    digest = sha256_file(path)
    headers = {
        SHA256_HEADER: digest,
        "Content-Length": str(size),
        "Content-Type": "application/octet-stream",
    }
    started, backoff, last = time.monotonic(), BACKOFF_MIN_S, ""
    with httpx.Client(timeout=timeout_s, follow_redirects=False, verify=verify) as http:
        for _ in range(MAX_ATTEMPTS):
            try:
                r = http.put(target.url, content=_chunks(path), headers=headers)
            except httpx.TransportError as exc:
                last = str(exc) or type(exc).__name__
            else:
                if r.status_code < 300:
                    return {"bytes": size, "digest": digest, "seconds": round(time.monotonic() - started, 6)}
                last = f"HTTP {r.status_code} {r.text[:300]}".rstrip()
                if r.status_code < 500:
                    break
            time.sleep(backoff)
            backoff = min(BACKOFF_MAX_S, backoff * 2)
    raise UploadError(f"output {name}: upload failed: {last}")


def upload_outputs(
    outputs_dir: Path,
    targets: dict[str, OutputTarget],
    verify: ssl.SSLContext | bool = True,
    plain_http_hosts: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """Every file of ``outputs_dir`` that has a target; a target whose file the workers did not
    write is listed under ``missing``. UploadError on the first that fails."""
    uploaded: dict[str, Any] = {}
    missing = []
    for name, target in sorted(targets.items()):
        path = outputs_dir / name
        if name == CHECKPOINT_OUTPUT:
            continue  # only after a task that did not finish (``upload_checkpoint``)
        if not path.is_file():
            missing.append(name)
            continue
        uploaded[name] = upload_file(path, target, verify=verify, plain_http_hosts=plain_http_hosts)
    return {"uploaded": uploaded, "missing": missing}


def newest_checkpoint(root: Path) -> Path | None:
    """The newest complete ``step_N`` directory under ``root`` (None: none complete)."""
    if not root.is_dir():
        return None
    found = [
        (int(m.group(1)), d)
        for d in root.iterdir()
        if (m := _STEP_DIR.match(d.name)) and (d / _DONE).is_file() and not d.is_symlink()
    ]
    return max(found)[1] if found else None


def pack_checkpoint(step_dir: Path, out: Path) -> Path:
    """A tar of one complete checkpoint, its files under ``step_N/`` (no links, no other entries)."""
    with tarfile.open(out, "w") as tar:
        for p in sorted(step_dir.rglob("*")):
            if p.is_file() and not p.is_symlink():
                tar.add(p, arcname=f"{step_dir.name}/{p.relative_to(step_dir).as_posix()}", recursive=False)
    return out


def upload_checkpoint(
    checkpoint_dir: Path,
    target: OutputTarget,
    scratch: Path,
    verify: ssl.SSLContext | bool = True,
    plain_http_hosts: frozenset[str] = frozenset(),
) -> dict[str, Any] | None:
    """The newest complete checkpoint as ``checkpoint.tar`` (None: there is none)."""
    newest = newest_checkpoint(checkpoint_dir)
    if newest is None:
        return None
    tar = pack_checkpoint(newest, scratch / CHECKPOINT_OUTPUT)
    try:
        sent = upload_file(tar, target, verify=verify, plain_http_hosts=plain_http_hosts)
        return sent | {"step_dir": newest.name}
    finally:
        tar.unlink(missing_ok=True)
