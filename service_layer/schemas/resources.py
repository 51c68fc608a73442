"""Regions, clusters, nodes, devices and links as the API shows them."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from service_layer.schemas.common import ApiModel


class RegionRead(BaseModel):
    name: str
    jurisdiction: str
    clusters: int = Field(description="Clusters in the region")
    alive_nodes: int
    devices: int = Field(description="Devices on alive nodes")


class DeviceRead(ApiModel):
    index: int
    model: str
    kind: str
    memory_gb: float
    measured_tflops: float
    allocated: bool = Field(False, description="Held by an active allocation")


class NodeRead(BaseModel):
    id: str
    hostname: str
    status: str = Field(description="alive | lost | drained (as the control plane last concluded)")
    alive: bool = Field(description="Heartbeat liveness key fresh right now")
    last_heartbeat_at: datetime | None
    heartbeat_age_s: float | None
    advertise_host: str
    agent_version: str
    devices: list[DeviceRead]


class ClusterRead(BaseModel):
    id: str
    name: str
    region: str
    provider: str
    intra_bandwidth_gbps: float
    price_per_device_hour: float | None
    spot_price_per_device_hour: float | None
    nodes: list[NodeRead]


class LinkUpsert(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "src": "eu-west",
                    "dst": "us-east",
                    "bandwidth_gbps": 0.5,
                    "latency_ms": 80,
                    "egress_price_per_gb": 0.05,
                }
            ]
        },
    )

    src: str = Field(min_length=1, max_length=64)
    dst: str = Field(min_length=1, max_length=64)
    # Bounds a real WAN link stays within: 10 Tbit/s, a minute of latency, $1000 per GB.
    bandwidth_gbps: float = Field(gt=0, le=10_000, allow_inf_nan=False)
    latency_ms: float = Field(ge=0, le=60_000, allow_inf_nan=False)
    egress_price_per_gb: float = Field(0.0, ge=0, le=1000, allow_inf_nan=False)


class LinkRead(ApiModel):
    id: str
    src: str
    dst: str
    bandwidth_gbps: float
    latency_ms: float
    egress_price_per_gb: float
    measured_at: datetime


class Health(BaseModel):
    status: str
    database: str
    bus: str
