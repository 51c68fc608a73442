"""The store the settings name, built once per process (``server.build_context``)."""

from __future__ import annotations

from orchestration.artifacts.local import LocalStore
from orchestration.artifacts.store import ArtifactStore
from orchestration.settings import Settings


def make_store(settings: Settings) -> ArtifactStore:
    """``embedded``: blobs under ``data_dir/artifacts``; ``s3``: the bucket the settings name (boto3 is
    imported only then)."""
    if settings.artifact_store == "s3":
        from orchestration.artifacts.s3 import S3Store

        return S3Store.from_settings(settings)
    return LocalStore(settings.data_dir / "artifacts")
