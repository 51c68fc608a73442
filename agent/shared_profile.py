"""One reference measurement shared by the agents of a host whose devices are alike.

A provider starting eight agents on one node would otherwise wait for eight reference steps in
turn (each one launches the real worker through torchrun: tens of seconds on a busy host) before
the last one registers, and every one would measure the same interpreter, torch and cores. The
first agent's figures are kept in a file beside the host's turn lock; an agent whose devices are
alike (same kind, model and cores, same interpreter and torch, same cpn) takes them while they are
fresh instead of measuring again. Each agent still settles the host's contention itself.

The file is trusted only when this user owns it and nobody else may write it: another local user
must not be able to hand an agent a profile.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import stat
import sys
import time
from importlib import metadata
from pathlib import Path

from contracts.registration import NodeProfile

log = logging.getLogger(__name__)

MAX_ENTRIES = 64  # alike-device kinds a host keeps figures for (oldest dropped beyond it)


def shared_path(lock_path: Path) -> Path:
    return lock_path.with_name(lock_path.name + ".profiles.json")


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "none"


def alike_key(device_kind: str, device_model: str, cores: int) -> str:
    """What must match for another agent's figures to be this one's."""
    parts = [device_kind, device_model, str(cores), sys.executable, _version("torch"), _version("cpn")]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def _read(path: Path) -> dict[str, dict]:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return {}
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        log.warning("shared reference figures %s are not this user's alone: measuring instead", path)
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def load_shared(
    path: Path, key: str, max_age_s: float, now: float | None = None
) -> tuple[dict, float] | None:
    """Another agent's figures for ``key`` and their age in seconds, when fresher than
    ``max_age_s``; None otherwise (0 turns sharing off)."""
    if max_age_s <= 0:
        return None
    entry = _read(path).get(key)
    if not isinstance(entry, dict):
        return None
    measured_at, profile = entry.get("measured_at"), entry.get("profile")
    if not isinstance(measured_at, int | float) or not isinstance(profile, dict):
        return None
    age = (time.time() if now is None else now) - measured_at
    if not 0 <= age <= max_age_s:
        return None
    return profile, age


def store_shared(path: Path, key: str, profile: NodeProfile, now: float | None = None) -> None:
    """Keep this agent's figures for the next alike agent (written whole, then renamed into place)."""
    entries = _read(path)
    entries[key] = {"measured_at": time.time() if now is None else now, "profile": profile.as_dict()}
    newest = sorted(entries.items(), key=lambda kv: kv[1].get("measured_at", 0), reverse=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(dict(newest[:MAX_ENTRIES]), f)
        os.replace(tmp, path)
    except OSError as exc:
        log.info("could not keep the reference figures for other agents (%s)", exc)
        with contextlib.suppress(OSError):
            tmp.unlink()
