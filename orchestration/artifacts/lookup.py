"""What the control layer asks of the store's metadata when it resolves a job's references: the
size of a blob a tenant uploaded (``control_layer.user_data.ArtifactLookup``)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from orchestration.artifacts.records import find_upload


@dataclass(frozen=True)
class DbArtifactLookup:
    session_factory: sessionmaker[Session]

    def size_of(self, tenant_id: str, digest: str) -> int | None:
        """Bytes of ``digest`` as ``tenant_id`` uploaded it; None when that tenant has no such upload."""
        with self.session_factory() as session:
            row = find_upload(session, tenant_id, digest)
            return None if row is None else int(row.bytes)
