"""Tenants, API keys and enrollment tokens."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from resource_layer.tokens import MAX_TOKEN_TTL_S, MAX_TOKEN_USES
from service_layer.schemas.common import ApiModel


class TenantCreate(BaseModel):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"name": "acme-research", "is_admin": False}]}
    )

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,127}$", description="Unique, lower-case")
    is_admin: bool = Field(
        False, description="The platform's own tenant: its keys may be admin or operator (default admin)"
    )


class TenantRead(ApiModel):
    id: str
    name: str
    is_admin: bool
    created_at: datetime
    max_devices: int | None = Field(None, description="Devices its jobs may hold at once; null: unlimited")
    max_monthly_spend: float | None = Field(
        None, description="Spend cap per calendar month (UTC); null: none"
    )
    max_artifact_bytes: int | None = Field(
        None, description="Bytes of artifacts it may keep; null: the server's CPN_ARTIFACT_QUOTA_BYTES"
    )


class QuotaUpdate(BaseModel):
    """A tenant's quotas, all replaced (null removes one)."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"max_devices": 8, "max_monthly_spend": 2500.0}]}
    )

    max_devices: int | None = Field(None, ge=0, le=1_000_000, description="null: unlimited")
    max_monthly_spend: float | None = Field(
        None, ge=0, le=1e12, allow_inf_nan=False, description="null: no cap"
    )
    max_artifact_bytes: int | None = Field(
        None, ge=0, le=1 << 50, description="Bytes of artifacts it may keep; null: the server's default"
    )


class ApiKeyCreated(BaseModel):
    id: str
    tenant_id: str
    prefix: str
    role: str = Field("tenant-admin", description="admin | operator | tenant-admin | member")
    key: str = Field(description="The key itself: shown once, only its hash is stored")
    created_at: datetime


class TokenCreate(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"provider": "lumen", "note": "eu-west rack 3", "ttl_s": 3600, "max_uses": 4}]
        },
    )

    provider: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9 ._-]{0,127}$",
        description="The provider whose nodes it enrolls: they join (and price) only its clusters",
    )
    note: str = Field("", max_length=255)
    ttl_s: float | None = Field(
        86_400.0,
        gt=0,
        le=MAX_TOKEN_TTL_S,
        allow_inf_nan=False,
        description="Seconds until it expires (at most ten years); null = never",
    )
    max_uses: int | None = Field(
        1,
        ge=1,
        le=MAX_TOKEN_USES,
        description="Registrations it allows (at most a million); null = unlimited",
    )


class TokenCreated(BaseModel):
    id: str
    token: str = Field(description="The enrollment token: shown once, give it to `cpn agent --token`")
    provider: str
    note: str
    max_uses: int | None
    expires_at: datetime | None


class AuditRead(ApiModel):
    id: int
    at: datetime
    actor_kind: str = Field(description="tenant (an API key), node (an agent) or system")
    actor_id: str
    action: str
    target: str
    source: str = Field(description="Client address the action came from")
    details: dict[str, Any]
