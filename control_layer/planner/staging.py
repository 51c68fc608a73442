"""Staging priced into an option: the time its nodes take to bring the job's code and data before
training starts, and the source's egress for the bytes that cross a region boundary.

Pure: (option, spec, snapshot, what is staged) -> the option re-priced. Each node stages once for
all its devices, the nodes in parallel: the slowest node sets ``staging_s``, which comes before
the start-up in the option's duration (the devices are held, so billed, meanwhile). A node's time
is its bytes over the measured bandwidth from the source to it (``DataStaging.rate``).
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


class StagedBlob(BaseModel):
    """One thing the nodes stage: its size (None: not known, priced as nothing to fetch, e.g. a
    ``file://`` already on the node) and the region its bytes come from (None: the store's)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    bytes: int | None = Field(default=None, ge=0)
    region: str | None = None


class DataStaging(BaseModel):
    """What an option's staging is priced from, resolved by the control plane at quote time.

    code: the code archive (every node stages it); source: data.source; shards: per region of
    data.shards; store_region: where the control plane's artifact store is served from (None:
    unknown, each node's own region); rates: per cluster id, the staging throughput learned from
    its agents' reported staging (bytes/s), which wins over the link guess.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    code: StagedBlob | None = None
    source: StagedBlob | None = None
    shards: dict[str, StagedBlob] = Field(default_factory=dict)
    store_region: str | None = None
    rates: dict[str, float] = Field(default_factory=dict)

    def rate(
        self, snapshot: ResourceSnapshot, cluster: str, region: str, calibration: Calibration | None
    ) -> tuple[float, str]:
        """(bytes/s, basis) from the source to a node of ``cluster`` in ``region``: the learned
        figure where the cluster has one, else the link from the store's region (its goodput
        applied); the store is served by the control plane, so that link is the node's to it."""
        learned = self.rates.get(cluster) or (
            calibration.staging_bytes_per_s.get(cluster) if calibration else None
        )
        if learned and learned > 0:
            return learned, "learned"
        home = self.store_region or region
        link = snapshot.link(home, region) or snapshot.link(region, region)
        assert link is not None  # a region's own link always exists
        goodput = cm.link_goodput(home, region, calibration, measured=link.source == "measured")
        return cm.bytes_per_s(link.bandwidth_gbps, goodput), f"link {home}->{region} ({link.source})"


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
    reads: list[StagedRead] = []
    unknown: set[str] = set()
    shard_of: dict[str, str] = {}
    for node, (cluster, region) in nodes.items():
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
        rate, basis = staging.rate(snapshot, cluster, region, calibration)
        total = crossing = 0
        usd = 0.0
        for field, blob, origin in items:
            if blob.bytes is None:
                unknown.add(field)
                continue
            total += blob.bytes
            # Bytes from elsewhere: a shard from its region, the rest from the store's.
            origin = origin or blob.region or staging.store_region or region
            if origin != region:
                crossing += blob.bytes
                link = snapshot.link(origin, region)
                usd += blob.bytes / cm.GB * (link.egress_price_per_gb if link is not None else 0.0)
        reads.append(
            StagedRead(
                node=node,
                region=region,
                items=[f for f, _, _ in items],
                bytes=total,
                bytes_per_s=rate,
                rate_basis=basis,
                seconds=total / rate,
                crossing_bytes=crossing,
                egress_usd=usd,
            )
        )
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
