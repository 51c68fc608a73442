"""Quota and retention decisions, pure: data in, data out."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from contracts.artifacts import MAX_ARTIFACT_BYTES, ArtifactKind
from contracts.errors import QuotaExceeded
from orchestration.artifacts.store import BlobInfo

# A blob nobody names is deleted only once it is this old: an upload writes its blob before its
# row, and the sweep must not take a blob between the two.
ORPHAN_GRACE = timedelta(hours=1)


def quota_of(tenant_max: int | None, default: int) -> int:
    """The tenant's storage quota in bytes: its own, else the server's default."""
    return default if tenant_max is None else tenant_max


def upload_limit(used: int, quota: int) -> int:
    """The most bytes one upload may bring now (0: none)."""
    return max(0, min(MAX_ARTIFACT_BYTES, quota - used))


def check_quota(used: int, quota: int, adding: int) -> None:
    """Raise QuotaExceeded (naming the numbers) unless ``adding`` more bytes fit."""
    if used + adding > quota:
        raise QuotaExceeded(
            f"artifact storage quota exceeded: the tenant keeps {used} of {quota} bytes and this "
            f"upload needs {adding} more; delete artifacts (cpn artifacts delete) or ask for a larger quota",
            used_bytes=used,
            quota_bytes=quota,
            needed_bytes=adding,
        )


def expiry(now: datetime, retention_days: float) -> datetime:
    return now + timedelta(days=retention_days)


def output_kind(name: str) -> ArtifactKind:
    """A job's output file's kind: its checkpoint, or (anything else) its model."""
    return "checkpoint" if name.lower().startswith("checkpoint") else "model"


def orphans(blobs: Iterable[BlobInfo], named: set[str], now: datetime) -> list[str]:
    """Blobs no row names, old enough that no upload is still between writing one and its row."""
    return [b.digest for b in blobs if b.digest not in named and b.modified_at < now - ORPHAN_GRACE]
