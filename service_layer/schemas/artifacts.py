"""The artifact store's REST shapes."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from service_layer.schemas.common import ApiModel


class ArtifactRead(ApiModel):
    id: str
    digest: str = Field(description="sha256:<hex> of the bytes")
    uri: str = Field(description="artifact:sha256:<hex>, for data.source, data.shards and code")
    bytes: int
    kind: str = Field(description="code | data | model | checkpoint | other")
    name: str
    job_id: str | None = Field(description="The job whose output this is; null: an upload")
    created_at: datetime
    expires_at: datetime = Field(description="Deleted after this (uploading the bytes again renews it)")
