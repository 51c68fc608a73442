"""Regions, clusters, nodes, devices and links as the API shows them."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from contracts.registration import JURISDICTION_RE
from service_layer.schemas.common import ApiModel


class RegionRead(BaseModel):
    name: str
    jurisdiction: str = Field(description="Set by an admin, or claimed by the region's first agent")
    jurisdiction_approved: bool = Field(
        False,
        description="An admin set it (PUT /v1/regions/{name}/jurisdiction); data residency trusts"
        " nothing else",
    )
    clusters: int = Field(description="Clusters in the region")
    alive_nodes: int = Field(description="Nodes alive and placeable (measured)")
    measuring_nodes: int = Field(
        0, description="Nodes alive but still measuring their profile: not placed yet"
    )
    devices: int = Field(description="Devices on alive, placeable nodes")


class DeviceRead(ApiModel):
    index: int
    model: str
    kind: str
    memory_gb: float
    measured_tflops: float
    allocated: bool = Field(False, description="Held by an active allocation")
    uuid: str = Field("", description="A CUDA device's GPU-/MIG- UUID (NVML); empty for CPU slots")
    link_group: int = Field(-1, description="Its NVLink island on the node; -1: not known")


class NodeStagingRead(BaseModel):
    """What the node's agent measured of staging after it registered (0: not measured)."""

    fetch_fixed_s: float = Field(0.0, description="Seconds one fetch from the store takes beyond its bytes")
    bytes_per_s: float = Field(0.0, description="The store's bytes per second to the node beyond that")
    venv_s: float = Field(0.0, description="CPU seconds of one venv build with nothing to install")
    error: str = Field("", description="Why the store was not measured")
    measured_at: datetime | None = None


class NodeRead(BaseModel):
    id: str
    hostname: str
    status: str = Field(
        description="alive (placeable) | measuring (registered and live, its profile not in yet: not"
        " placed) | lost | revoked | drained (as the control plane last concluded)"
    )
    cordon: str = Field("", description='An operator\'s hold: "" (open) | cordoned | draining')
    alive: bool = Field(description="Heartbeat liveness key fresh right now")
    last_heartbeat_at: datetime | None
    heartbeat_age_s: float | None
    advertise_host: str
    agent_version: str
    sandbox: str = Field(
        "none",
        description="Whether it runs users' code: bubblewrap (sandboxed) | unsandboxed-allowed | none",
    )
    staging: NodeStagingRead | None = Field(None, description="Its staging figures; null: not reported")
    devices: list[DeviceRead]
    cordon_reason: str = Field("", description="Why its GPU health rules cordoned it; empty: not so cordoned")
    device_samples: dict[str, Any] | None = Field(
        None,
        description="Its GPUs as the last stored heartbeat sampled them: at, and per device index,"
        " utilization (0..1), memory_used_gb, power_w, temperature_c, health (empty: healthy)",
    )


class ClusterRead(BaseModel):
    id: str
    name: str
    region: str
    provider: str
    intra_bandwidth_gbps: float
    price_per_device_hour: float | None
    spot_price_per_device_hour: float | None
    nodes: list[NodeRead]


class JurisdictionSet(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"jurisdiction": "EU", "reason": "contract 2026-114"}]},
    )

    jurisdiction: str = Field(pattern=f"^{JURISDICTION_RE.pattern}$", max_length=16, description="e.g. EU")
    reason: str = Field("", max_length=500, description="Why, for the audit log")


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
                    "private": False,
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
    private: StrictBool = Field(
        False,
        description="The providers' word that the link is private (their own network or a private"
        " interconnect): torchrun groups spanning clusters may send their plaintext gloo/NCCL traffic"
        " only over private links. src = dst: the region's own network between its clusters",
    )


class DeclaredLinkRead(ApiModel):
    """A link as an admin declared it (the fallback where no fresh measurement exists)."""

    id: str
    src: str
    dst: str
    bandwidth_gbps: float
    latency_ms: float
    egress_price_per_gb: float
    private: bool
    measured_at: datetime = Field(description="When it was declared")


class LinkRead(BaseModel):
    """A link as the planner uses it now."""

    src: str
    dst: str
    bandwidth_gbps: float
    latency_ms: float = Field(description="One way (half the measured round trip when measured)")
    egress_price_per_gb: float = Field(description="From the declared link (either direction); 0 if none")
    private: bool = Field(
        description="Declared private (PUT /v1/links); no probe can tell. False where undeclared"
    )
    source: Literal["measured", "declared"] = Field(
        description="measured: agents' probes within the freshness window; declared: PUT /v1/links"
    )
    as_of: datetime = Field(description="When it was measured (newest probe) or declared")
    basis: str = Field(description="From what, in words")
    samples: int = Field(description="Probes the measured figures are the median of; 0 when declared")


class LinkProbeRead(ApiModel):
    """One probe of the link src_region -> dst_region (the newest few per pair are kept)."""

    id: str
    src_region: str
    dst_region: str
    src_node_id: str = Field(description="The prober")
    dst_node_id: str = Field(description="The target, which received the bulk transfer")
    status: str = Field(description="pending | ok | failed")
    bulk_bytes: int
    echoes: int
    rtt_ms: float | None
    bandwidth_gbps: float | None
    duration_s: float | None = Field(description="Link time the probe took (what the 1 % budget counts)")
    error: str
    requested_at: datetime
    finished_at: datetime | None


class Health(BaseModel):
    status: str
    database: str
    bus: str
    replica: str = Field(description="The replica (with `cpn server --workers`, the worker) that answered")
