"""Staging priced into an option: the time its nodes take to bring the job's code and data before
training starts, and the source's egress for the bytes that cross a region boundary.

Pure: (option, spec, snapshot, what is staged) -> the option re-priced. Each node stages once for
all its devices, the nodes in parallel: the slowest node sets ``staging_s``, which comes before
the start-up in the option's duration (the devices are held, so billed, meanwhile). A node's time
is, for each item it does not hold already, a fetch's fixed seconds plus its bytes over the rate
from the store (``DataStaging.fetch_fixed``, ``DataStaging.rate``: learned from its staging, else
measured by its agent's store probe), then a venv build where it holds none (its CPU seconds at the
host share the plan leaves it). What a node's cache holds costs nothing, in time or egress.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from contracts.job_spec import JobSpec
from control_layer.planner import cost_model as cm
from control_layer.planner.intervals import interval
from control_layer.planner.plan_types import (
    Calibration,
    CostBreakdown,
    PlanOption,
    StagedRead,
    StagingEstimate,
)
from control_layer.planner.snapshot import ResourceSnapshot

DEFAULT_FETCH_FIXED_S = 0.05  # a node that never measured: a fetch's fixed part on loopback
DEFAULT_VENV_S = 1.0  # ... and a venv build's CPU seconds (pip's start-up: 1.0-1.15 s measured)


class StagedBlob(BaseModel):
    """One thing the nodes stage: its size (None: not known, priced as nothing to fetch, e.g. a
    ``file://`` already on the node), the region its bytes come from (None: the store's) and its
    digest (None: not known; a node's cache is matched by it)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    bytes: int | None = Field(default=None, ge=0)
    region: str | None = None
    digest: str | None = None


class NodeStaging(BaseModel):
    """What a node's agent measured of staging after it registered (0: not measured): a fetch's
    fixed seconds beyond its bytes, the store's bytes/s to it beyond those, and a venv build's CPU
    seconds with nothing to install (per idle core)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    fetch_fixed_s: float = Field(default=0.0, ge=0)
    bytes_per_s: float = Field(default=0.0, ge=0)
    venv_s: float = Field(default=0.0, ge=0)


class DataStaging(BaseModel):
    """What an option's staging is priced from, resolved by the control plane at quote time.

    code: the code archive (every node stages it); source: data.source; shards: per region of
    data.shards; store_region: where the control plane's artifact store is served from (None:
    unknown, each node's own region); requirements_digest: the code's requirements, a venv each
    node builds; nodes: per node id, what its agent measured; cached / venvs: per node id, the
    job's blob digests and requirements digests it holds already (nothing to stage for them).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    code: StagedBlob | None = None
    source: StagedBlob | None = None
    shards: dict[str, StagedBlob] = Field(default_factory=dict)
    store_region: str | None = None
    requirements_digest: str | None = None
    nodes: dict[str, NodeStaging] = Field(default_factory=dict)
    cached: dict[str, list[str]] = Field(default_factory=dict)
    venvs: dict[str, list[str]] = Field(default_factory=dict)

    def rate(
        self,
        snapshot: ResourceSnapshot,
        node: str,
        region: str,
        calibration: Calibration | None,
    ) -> tuple[float, str]:
        """(bytes/s, basis) from the store to ``node`` in ``region``: learned from its staging,
        else its agent's probe, else the link from the store's region (its goodput applied)."""
        learned = calibration.staging_bytes_per_s.get(node) if calibration else None
        if learned and learned > 0:
            return learned, "learned"
        probed = self.nodes.get(node)
        if probed is not None and probed.bytes_per_s > 0:
            return probed.bytes_per_s, "measured"
        home = self.store_region or region
        link = snapshot.link(home, region) or snapshot.link(region, region)
        assert link is not None  # a region's own link always exists
        goodput = cm.link_goodput(home, region, calibration, measured=link.source == "measured")
        return cm.bytes_per_s(link.bandwidth_gbps, goodput), f"link {home}->{region} ({link.source})"

    def fetch_fixed(self, node: str, calibration: Calibration | None) -> tuple[float, str]:
        """(seconds, basis) one fetch takes at ``node`` beyond its bytes."""
        learned = calibration.staging_fixed_s.get(node) if calibration else None
        if learned is not None:
            return learned, "learned"
        probed = self.nodes.get(node)
        if probed is not None and probed.bytes_per_s > 0:  # its fixed part measured with its rate
            return probed.fetch_fixed_s, "measured"
        return DEFAULT_FETCH_FIXED_S, "default"

    def venv_build(self, node: str, calibration: Calibration | None) -> tuple[float, str]:
        """(CPU seconds, basis) of a venv build at ``node``, per idle core."""
        learned = calibration.venv_s.get(node) if calibration else None
        if learned is not None:
            return learned, "learned"
        probed = self.nodes.get(node)
        if probed is not None and probed.venv_s > 0:
            return probed.venv_s, "measured"
        return DEFAULT_VENV_S, "default"


def shard_for(spec: JobSpec, region: str, snapshot: ResourceSnapshot) -> str | None:
    """The shard (its region's name) tasks in ``region`` read: their own, else the non-resident
    shard with the fastest link to them (ties: by name); None when none may be read there."""
    shards = spec.data.shards or {}
    if region in shards:
        return region
    open_ = sorted(r for r, s in shards.items() if not s.resident)
    if not open_:
        return None

    def speed(r: str) -> float:
        link = snapshot.link(r, region)
        return link.bandwidth_gbps if link is not None else 0.0

    return max(open_, key=lambda r: (speed(r), -open_.index(r)))


def price_staging(
    option: PlanOption,
    spec: JobSpec,
    snapshot: ResourceSnapshot,
    staging: DataStaging,
    calibration: Calibration | None = None,
) -> PlanOption:
    """``option`` with its staging priced: ``estimates.staging_s`` (added to the duration, the
    devices billed for it), ``estimates.staging`` (per node) and ``cost.staging_egress``."""
    clusters = snapshot.clusters_by_id()
    nodes: dict[str, tuple[str, str]] = {}  # node -> (cluster, region), in task order
    for t in option.tasks:
        nodes.setdefault(t.node, (t.cluster, clusters[t.cluster].region))
    basis = option.estimates.basis
    reads: list[StagedRead] = []
    unknown: set[str] = set()
    shard_of: dict[str, str] = {}
    for node, (_cluster, region) in nodes.items():
        items: list[tuple[str, StagedBlob, str | None]] = []  # (field, blob, region the bytes leave)
        if staging.code is not None:
            items.append(("code", staging.code, None))
        if spec.data.shards:
            name = shard_for(spec, region, snapshot)
            if name is not None:
                shard_of[region] = name
                blob = staging.shards.get(name, StagedBlob())
                items.append((f"data.shards.{name}", blob, blob.region or name))
        elif spec.data.source is not None and staging.source is not None:
            items.append(("data.source", staging.source, None))
        # One process per node stages (the agent, then pip): its CPU work runs at the share of
        # the host's cores the plan's launchers get (``host_shares(one_per_node=True)``).
        share = max(1.0, (basis.launch_share.get(node) if basis is not None else None) or 1.0)
        reads.append(_node_read(node, region, items, staging, snapshot, calibration, share, unknown))
    seconds = max((r.seconds for r in reads), default=0.0)
    est = option.estimates
    hourly = est.cost.devices / est.duration_s if est.duration_s > 0 else 0.0
    egress = sum(r.egress_usd for r in reads)
    cost = CostBreakdown(
        devices=est.cost.devices + hourly * seconds, egress=est.cost.egress, staging_egress=egress
    )
    duration = est.duration_s + seconds
    summary = StagingEstimate(
        seconds=seconds,
        bytes=sum(r.bytes for r in reads),
        crossing_bytes=sum(r.crossing_bytes for r in reads),
        egress_usd=egress,
        reads=reads,
        shard_of_region=shard_of,
        unknown=sorted(unknown),
    )
    priced = est.model_copy(
        update={
            "staging_s": seconds,
            "staging": summary,
            "duration_s": duration,
            "cost": cost,
            "interval": interval(duration, cost.total, calibration),
        }
    )
    return option.model_copy(update={"estimates": priced})


def _node_read(
    node: str,
    region: str,
    items: list[tuple[str, StagedBlob, str | None]],
    staging: DataStaging,
    snapshot: ResourceSnapshot,
    calibration: Calibration | None,
    share: float,
    unknown: set[str],
) -> StagedRead:
    """One node's staging: each item it does not hold fetched (fixed seconds + bytes over the
    rate, egress where the bytes cross a region), then the venv where it holds none."""
    rate, rate_basis = staging.rate(snapshot, node, region, calibration)
    fixed, fixed_basis = staging.fetch_fixed(node, calibration)
    held = set(staging.cached.get(node, ()))
    total = crossing = fetches = 0
    usd = 0.0
    cached = []
    for field, blob, origin in items:
        if blob.digest is not None and blob.digest in held:
            cached.append(field)
            continue
        if blob.bytes is None:
            unknown.add(field)
            continue
        fetches += 1
        total += blob.bytes
        # Bytes from elsewhere: a shard from its region, the rest from the store's.
        origin = origin or blob.region or staging.store_region or region
        if origin != region:
            crossing += blob.bytes
            link = snapshot.link(origin, region)
            usd += blob.bytes / cm.GB * (link.egress_price_per_gb if link is not None else 0.0)
    venv_s, venv_basis = 0.0, ""
    req = staging.requirements_digest
    if req is not None and req not in staging.venvs.get(node, ()):
        per_core, venv_basis = staging.venv_build(node, calibration)
        venv_s = per_core * share
    elif req is not None:
        cached.append("venv")
    return StagedRead(
        node=node,
        region=region,
        items=[f for f, _, _ in items],
        cached=cached,
        bytes=total,
        bytes_per_s=rate,
        rate_basis=rate_basis,
        fetches=fetches,
        fetch_fixed_s=fixed,
        fixed_basis=fixed_basis,
        venv_s=venv_s,
        venv_basis=venv_basis,
        share=share,
        seconds=fetches * fixed + total / rate + venv_s,
        crossing_bytes=crossing,
        egress_usd=usd,
    )
