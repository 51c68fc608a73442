"""Artifacts: the tenant-owned records of blobs in the artifact store (``orchestration.artifacts``).

A blob is stored once per digest; each row is one tenant's (or one job's) claim on it. Quotas count
rows' bytes, retention deletes expired rows, and a blob no row names any more is deleted with them.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, Index, String
from sqlalchemy.orm import Mapped, mapped_column

from orchestration.db.base import Base, new_id, utcnow


class Artifact(Base):
    __tablename__ = "artifacts"
    __table_args__ = (
        Index("ix_artifacts_tenant_digest", "tenant_id", "digest"),
        Index("ix_artifacts_job_name", "job_id", "name"),
        Index("ix_artifacts_digest", "digest"),
        Index("ix_artifacts_expires_at", "expires_at"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    digest: Mapped[str] = mapped_column(String(71))  # sha256:<64 hex>
    bytes: Mapped[int] = mapped_column(BigInteger)
    kind: Mapped[str] = mapped_column(String(16))  # contracts.artifacts.ArtifactKind
    name: Mapped[str] = mapped_column(String(255), default="")
    # The job whose output this is; no foreign key: outputs outlive their job's row if it goes.
    job_id: Mapped[str | None] = mapped_column(String(32), default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime] = mapped_column()
