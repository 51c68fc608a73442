"""Resource-layer tables: where compute lives, what it costs and how regions are linked."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ForeignKey, Index, String, UniqueConstraint, false
from sqlalchemy.orm import Mapped, mapped_column, relationship

from orchestration.db.base import Base, new_id, utcnow


class Region(Base):
    __tablename__ = "regions"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    # Claimed by the region's first agent, or set by an admin; data residency trusts it only once
    # an admin approved it (``jurisdiction_approved``): a claim alone is never trusted.
    jurisdiction: Mapped[str] = mapped_column(String(16), default="")
    jurisdiction_approved: Mapped[bool] = mapped_column(default=False, server_default=false())
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Provider(Base):
    __tablename__ = "providers"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Cluster(Base):
    __tablename__ = "clusters"
    __table_args__ = (UniqueConstraint("region", "name"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(128))
    region: Mapped[str] = mapped_column(ForeignKey("regions.name"), index=True)
    provider_id: Mapped[str] = mapped_column(ForeignKey("providers.id"))
    intra_bandwidth_gbps: Mapped[float] = mapped_column(default=100.0)
    intra_latency_ms: Mapped[float] = mapped_column(default=0.01)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    nodes: Mapped[list[Node]] = relationship(back_populates="cluster", lazy="raise")
    provider: Mapped[Provider] = relationship(lazy="raise")


class Node(Base):
    __tablename__ = "nodes"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    cluster_id: Mapped[str] = mapped_column(ForeignKey("clusters.id"), index=True)
    hostname: Mapped[str] = mapped_column(String(255), default="", index=True)  # its host's other nodes
    token_hash: Mapped[str] = mapped_column(String(128))
    advertise_host: Mapped[str] = mapped_column(String(255), default="127.0.0.1")
    sync_port_min: Mapped[int] = mapped_column(default=0)
    sync_port_max: Mapped[int] = mapped_column(default=0)
    probe_port: Mapped[int] = mapped_column(default=0)  # its LinkProbeService; 0: none
    # Its CheckpointService (mutual TLS with each job's credentials); 0: it serves no checkpoints.
    checkpoint_port: Mapped[int] = mapped_column(default=0, server_default="0")
    probe_key: Mapped[str] = mapped_column(String(64), default="")  # signs tickets of probes aimed at it
    # alive | lost | revoked (its credentials refused) | drained (kept for older rows)
    status: Mapped[str] = mapped_column(String(16), default="alive", index=True)
    # An operator's hold, apart from liveness: "" open | cordoned (no new placements) | draining
    # (cordoned, its agent told to drain and its jobs moved off). It survives loss and revival.
    cordon: Mapped[str] = mapped_column(String(16), default="")
    # Why it is cordoned when its agent's GPU health rules did it (agent/gpu_health.py): the
    # device and its fault; "": open, or cordoned by an operator.
    cordon_reason: Mapped[str] = mapped_column(String(500), default="", server_default="")
    # Its GPUs as the last stored heartbeat sampled them: {"at": ISO time, "devices": [{index,
    # utilization, memory_used_gb, power_w, temperature_c, health}]}; None: not a GPU node.
    device_samples: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    # The enrollment token it first registered with (None: registered before this was kept). An
    # agent whose node credentials are refused enrolls again with it, as a new node.
    enrollment_token_id: Mapped[str | None] = mapped_column(String(32), default=None)
    agent_version: Mapped[str] = mapped_column(String(32), default="")
    last_heartbeat_at: Mapped[datetime | None] = mapped_column(default=None)
    registered_at: Mapped[datetime] = mapped_column(default=utcnow)
    # What the node measured at registration (contracts.registration.NodeProfile.as_dict); None: not measured.
    profile: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    # Its agent registered before measuring that profile and has not sent it yet: listed
    # "measuring" and not placed until it arrives (resource_layer.registry.record_profile).
    measuring: Mapped[bool] = mapped_column(default=False, server_default=false())
    # Runnable threads per core on the host now, a new CPU worker included (agent/contention.py:
    # above 1 it runs that many times slower than on an idle core, below 1 cores are left), as the
    # last stored heartbeat reported it; None: not reported.
    cpu_contention: Mapped[float | None] = mapped_column(default=None)
    # CPU slots of the host's other nodes the control plane knew busy when the probes behind that
    # figure were taken (the mean over the instants its interquartile mean kept); the planner takes
    # them out and adds those busy at the quote. None: not known (an agent that sends no ages).
    cpu_contention_busy: Mapped[float | None] = mapped_column(default=None)
    # The node's own port into its cluster's fabric, as its agent declared it (a slower NIC or an
    # oversubscribed switch than the cluster's figure); None: the cluster's figures hold.
    fabric_bandwidth_gbps: Mapped[float | None] = mapped_column(default=None)
    fabric_latency_ms: Mapped[float | None] = mapped_column(default=None)
    # Where the region's other clusters reach the node's torchrun endpoint (its agent's
    # --cross-cluster-host); None: it runs groups with its own cluster's nodes only.
    cross_cluster_host: Mapped[str | None] = mapped_column(String(255), default=None)
    # Whether and how it runs users' code (contracts.registration.SANDBOX_KINDS), as its agent
    # registered: the planner places jobs with an entrypoint only where it may.
    sandbox: Mapped[str] = mapped_column(String(32), default="none", server_default="none")
    # What staging costs there, as its agent measured it after registering
    # (contracts.node_staging.StagingProbe.as_dict, with measured_at); None: not reported.
    staging_probe: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    # A scheduler-backed node (a Slurm cluster's agent): how many of its devices are not cpn's to
    # use now (its cluster's own users hold them, or their nodes are drained or down), as its agent
    # last reported; the planner leaves that many of its free devices alone. 0 elsewhere.
    devices_unavailable: Mapped[int] = mapped_column(default=0, server_default="0")
    # Its agent's estimate of how long a task submitted now waits in its cluster's queue
    # (agent/slurm_queue.py); the quote prices it. 0 elsewhere.
    queue_wait_s: Mapped[float] = mapped_column(default=0.0, server_default="0")

    cluster: Mapped[Cluster] = relationship(back_populates="nodes", lazy="raise")
    accelerators: Mapped[list[Accelerator]] = relationship(back_populates="node", lazy="raise")


class NodeCacheEntry(Base):
    """One thing a node's cache holds, as its agent last reported it: a blob by its digest, or a
    venv by its requirements' digest. Quotes price what a node holds as nothing to stage."""

    __tablename__ = "node_cache"
    __table_args__ = (Index("ix_node_cache_digest", "digest"),)

    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"), primary_key=True)
    kind: Mapped[str] = mapped_column(String(8), primary_key=True)  # blob | venv
    digest: Mapped[str] = mapped_column(String(71), primary_key=True)  # sha256:<64 hex>


class Accelerator(Base):
    __tablename__ = "accelerators"
    __table_args__ = (UniqueConstraint("node_id", "index"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.id"), index=True)
    index: Mapped[int]
    model: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(16), default="cpu")
    memory_gb: Mapped[float]
    measured_tflops: Mapped[float]
    uuid: Mapped[str] = mapped_column(String(64), default="", server_default="")  # GPU-/MIG-; "": none
    # Its NVLink island on the node (devices of one island reach each other over NVLink); -1: not known.
    link_group: Mapped[int] = mapped_column(default=-1, server_default="-1")

    node: Mapped[Node] = relationship(back_populates="accelerators", lazy="raise")


class Link(Base):
    """A measured (or declared) link between two regions; symmetric unless both directions exist.
    ``src == dst``: the region's own network between its clusters."""

    __tablename__ = "links"
    __table_args__ = (UniqueConstraint("src", "dst"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    src: Mapped[str] = mapped_column(ForeignKey("regions.name"))
    dst: Mapped[str] = mapped_column(ForeignKey("regions.name"))
    bandwidth_gbps: Mapped[float]
    latency_ms: Mapped[float]
    egress_price_per_gb: Mapped[float] = mapped_column(default=0.0)
    # Declared private by the providers: a torchrun group's plaintext gloo/NCCL traffic may cross it.
    private: Mapped[bool] = mapped_column(default=False, server_default=false())
    measured_at: Mapped[datetime] = mapped_column(default=utcnow)


class LinkProbe(Base):
    """One probe of the link src_region -> dst_region: ordered, then measured (or failed).

    History is bounded: the resource layer keeps the newest few per region pair.
    """

    __tablename__ = "link_probes"
    __table_args__ = (Index("ix_link_probes_pair", "src_region", "dst_region", "requested_at"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    src_region: Mapped[str] = mapped_column(String(64))
    dst_region: Mapped[str] = mapped_column(String(64))
    src_node_id: Mapped[str] = mapped_column(String(32), index=True)  # the prober
    dst_node_id: Mapped[str] = mapped_column(String(32))  # the target
    status: Mapped[str] = mapped_column(String(16), default="pending")  # pending | ok | failed
    bulk_bytes: Mapped[int]
    echoes: Mapped[int]
    rtt_ms: Mapped[float | None] = mapped_column(default=None)
    bandwidth_gbps: Mapped[float | None] = mapped_column(default=None)
    duration_s: Mapped[float | None] = mapped_column(default=None)  # the link time the probe took
    error: Mapped[str] = mapped_column(String(500), default="")
    requested_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)


class Price(Base):
    """Price history of a cluster; the newest row is in force."""

    __tablename__ = "prices"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    cluster_id: Mapped[str] = mapped_column(ForeignKey("clusters.id"), index=True)
    price_per_device_hour: Mapped[float]
    spot_price_per_device_hour: Mapped[float | None] = mapped_column(default=None)
    effective_from: Mapped[datetime] = mapped_column(default=utcnow)
    set_by_node_id: Mapped[str | None] = mapped_column(String(32), default=None)  # None: an admin


class EnrollmentToken(Base):
    __tablename__ = "enrollment_tokens"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    token_hash: Mapped[str] = mapped_column(String(128), unique=True)
    provider: Mapped[str] = mapped_column(String(128))  # its nodes join only this provider's clusters
    note: Mapped[str] = mapped_column(String(255), default="")
    max_uses: Mapped[int | None] = mapped_column(default=None)
    uses: Mapped[int] = mapped_column(default=0)
    expires_at: Mapped[datetime | None] = mapped_column(default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)  # enrolls nothing once set
