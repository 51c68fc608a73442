"""The ``artifacts`` rows: record uploads and outputs, list, delete, and the retention sweep."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session, sessionmaker

from contracts.artifacts import ArtifactKind
from contracts.errors import NotFound
from orchestration.artifacts import policy
from orchestration.artifacts.store import ArtifactStore, Stored
from orchestration.db.engine import session_scope
from orchestration.db.models import Artifact, Tenant

log = logging.getLogger(__name__)

MAX_LIST = 1000


def usage(session: Session, tenant_id: str) -> int:
    """Bytes the tenant keeps: every row counts (two names for one blob count twice)."""
    return int(
        session.scalar(
            select(func.coalesce(func.sum(Artifact.bytes), 0)).where(Artifact.tenant_id == tenant_id)
        )
        or 0
    )


def quota(session: Session, tenant_id: str, default: int) -> int:
    own = session.scalar(select(Tenant.max_artifact_bytes).where(Tenant.id == tenant_id))
    return policy.quota_of(own, default)


def find_upload(session: Session, tenant_id: str, digest: str) -> Artifact | None:
    """The tenant's own upload of ``digest`` (not a job's output), if any."""
    return session.scalars(
        select(Artifact)
        .where(Artifact.tenant_id == tenant_id, Artifact.digest == digest, Artifact.job_id.is_(None))
        .order_by(Artifact.created_at)
        .limit(1)
    ).first()


def record_upload(
    session: Session,
    *,
    tenant_id: str,
    stored: Stored,
    kind: ArtifactKind,
    name: str,
    now: datetime,
    retention_days: float,
    quota_bytes: int,
) -> tuple[Artifact, bool]:
    """The tenant's row for ``stored`` (True: new). Uploading a digest again renews its expiry and
    counts once; a new row must fit the quota (QuotaExceeded: nothing recorded)."""
    row = find_upload(session, tenant_id, stored.digest)
    if row is not None:
        row.expires_at = policy.expiry(now, retention_days)
        return row, False
    policy.check_quota(usage(session, tenant_id), quota_bytes, stored.bytes)
    row = Artifact(
        tenant_id=tenant_id,
        digest=stored.digest,
        bytes=stored.bytes,
        kind=kind,
        name=name,
        created_at=now,
        expires_at=policy.expiry(now, retention_days),
    )
    session.add(row)
    session.flush()
    return row, True


def record_output(
    session: Session,
    *,
    tenant_id: str,
    job_id: str,
    name: str,
    stored: Stored,
    now: datetime,
    retention_days: float,
) -> tuple[Artifact, bool]:
    """The job's output ``name`` (True: new); a retried upload replaces what the name held."""
    row = session.scalars(select(Artifact).where(Artifact.job_id == job_id, Artifact.name == name)).first()
    expires = policy.expiry(now, retention_days)
    if row is not None:
        row.digest, row.bytes, row.expires_at = stored.digest, stored.bytes, expires
        return row, False
    row = Artifact(
        tenant_id=tenant_id,
        digest=stored.digest,
        bytes=stored.bytes,
        kind=policy.output_kind(name),
        name=name,
        job_id=job_id,
        created_at=now,
        expires_at=expires,
    )
    session.add(row)
    session.flush()
    return row, True


def named(session: Session, digest: str) -> bool:
    return session.scalar(select(Artifact.id).where(Artifact.digest == digest).limit(1)) is not None


def list_rows(
    session: Session,
    *,
    tenant_id: str | None,
    job_id: str | None = None,
    kind: str | None = None,
    digest: str | None = None,
    limit: int = MAX_LIST,
) -> list[Artifact]:
    """Newest first; ``tenant_id`` None: every tenant's."""
    q = select(Artifact).order_by(Artifact.created_at.desc(), Artifact.id).limit(limit)
    if tenant_id is not None:
        q = q.where(Artifact.tenant_id == tenant_id)
    if job_id is not None:
        q = q.where(Artifact.job_id == job_id).order_by(None).order_by(Artifact.name)
    if kind is not None:
        q = q.where(Artifact.kind == kind)
    if digest is not None:
        q = q.where(Artifact.digest == digest)
    return list(session.scalars(q))


def get_row(session: Session, tenant_id: str | None, artifact_id: str) -> Artifact:
    """The artifact, NotFound when absent or another tenant's (``tenant_id`` None: any)."""
    row = session.get(Artifact, artifact_id)
    if row is None or (tenant_id is not None and row.tenant_id != tenant_id):
        raise NotFound(f"artifact {artifact_id} not found", artifact_id=artifact_id)
    return row


def delete_row(
    session_factory: sessionmaker[Session], store: ArtifactStore, tenant_id: str | None, artifact_id: str
) -> Artifact:
    """Delete the row, then its blob if no row names it any more."""
    with session_scope(session_factory) as session:
        row = get_row(session, tenant_id, artifact_id)
        session.delete(row)
        session.flush()
        orphan = not named(session, row.digest)
    if orphan:
        store.delete(row.digest)
    return row


@dataclass(frozen=True)
class Swept:
    rows: int
    blobs: int
    uploads: int


def sweep(
    session_factory: sessionmaker[Session],
    store: ArtifactStore,
    now: datetime,
    keep: Iterable[str] = (),
) -> Swept:
    """Retention: delete expired rows, then blobs no row names (past ``policy.ORPHAN_GRACE``) and
    unfinished uploads. ``keep``: blobs the control plane itself keeps (the store probe's).
    Idempotent, so it needs no fencing."""
    with session_scope(session_factory) as session:
        rows = session.execute(delete(Artifact).where(Artifact.expires_at < now)).rowcount or 0
    with session_factory() as session:
        names = set(session.scalars(select(Artifact.digest).distinct())) | set(keep)
    blobs = 0
    for digest in policy.orphans(store.blobs(), names, now):
        with session_factory() as session:
            if named(session, digest):  # named since the listing
                continue
        blobs += store.delete(digest)
    uploads = store.stale_uploads(now - policy.ORPHAN_GRACE)
    if rows or blobs or uploads:
        log.info("artifact sweep: %d expired rows, %d blobs, %d unfinished uploads", rows, blobs, uploads)
    return Swept(rows, blobs, uploads)
