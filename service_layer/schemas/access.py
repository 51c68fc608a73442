"""API keys with roles, enrollment tokens as listed, and an operator's actions on nodes."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from contracts.roles import Role
from orchestration.db.engine import as_utc
from service_layer.schemas.common import ApiModel

# SQLite hands timestamps back naive; every one this project stores is UTC.
Utc = Annotated[datetime, AfterValidator(as_utc)]


class KeyCreate(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"role": "member", "name": "ana"}]},
    )

    role: Role = Field(Role.MEMBER, description="admin | operator | tenant-admin | member")
    name: str = Field("", max_length=64, pattern=r"^[A-Za-z0-9 ._@-]*$", description="The member holding it")
    tenant_id: str | None = Field(
        None, max_length=32, description="Admin only: the tenant to create it for (default: your own)"
    )


class KeyRead(ApiModel):
    id: str
    tenant_id: str
    prefix: str = Field(description="The key's first characters, to recognise it")
    role: Role
    name: str
    created_at: Utc
    revoked_at: Utc | None


class KeyCreated(KeyRead):
    key: str = Field(description="The key itself: shown once, only its hash is stored")


class TokenRead(ApiModel):
    id: str
    provider: str
    note: str
    max_uses: int | None
    uses: int
    expires_at: Utc | None
    created_at: Utc
    revoked_at: Utc | None


class NodeAction(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field("", max_length=255, description="Why, for the audit log and the agent")


class NodeControlRead(BaseModel):
    """A node after an operator's action, and what happened to the jobs on it."""

    node_id: str
    status: str = Field(description="alive | lost | revoked | drained (liveness and credentials)")
    cordon: str = Field(description='"" (open) | cordoned | draining')
    moved_jobs: list[str] = Field(default_factory=list, description="Jobs checkpointed and requeued off it")
    running_jobs: list[str] = Field(
        default_factory=list, description="Jobs still running on it (left to finish, or not movable)"
    )
    note: str = ""
