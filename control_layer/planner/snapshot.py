"""The resource snapshot: the frozen state of the fleet a plan is made against (plain, JSON-able)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from contracts.job_spec import invalid_argument_from
from contracts.registration import MAX_FABRIC_GBPS, MAX_FABRIC_LATENCY_MS, MIN_CONTENTION

# Two clusters in the same region talk over the region's fabric unless a link says otherwise.
LOCAL_BANDWIDTH_GBPS = 100.0
LOCAL_LATENCY_MS = 0.5

T = TypeVar("T")
_MISSING = object()  # ``derived``: no value kept yet (a kept value may be None)


class _Plain(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DeviceSlot(_Plain):
    index: int = Field(ge=0)
    model: str = Field(min_length=1)
    memory_gb: float = Field(gt=0)
    tflops: float = Field(
        gt=0, description="Measured dense TFLOPS at the device's native precision: bf16 on CUDA, fp32 on CPU."
    )
    free: bool = True
    link_group: int = Field(
        default=-1,
        ge=-1,
        description="Its NVLink island on its node (its devices reach each other over NVLink); -1: unknown",
    )
    kind: Literal["cuda", "cpu"] = Field(
        default=None,  # type: ignore[assignment]
        description="Device kind; when left out, 'cpu' for a device whose model is 'cpu', else 'cuda'.",
    )

    @model_validator(mode="before")
    @classmethod
    def _kind_from_model(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("kind") is None:
            model = str(data.get("model", ""))
            return {**data, "kind": "cpu" if model.strip().lower() == "cpu" else "cuda"}
        return data


class _Measured(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class StepRateInfo(_Measured):
    """One precision's reference training step on one of the node's devices (``agent/profile.py``)."""

    tflops: float = Field(gt=0, description="Achieved model FLOP/s of forward+backward, TFLOPS.")
    micro_batch_s: float = Field(default=0.0, ge=0, description="Fixed seconds per micro-batch.")
    step_s: float = Field(default=0.0, ge=0, description="Fixed seconds per step.")
    optimizer_s_per_mparam: float = Field(default=0.0, ge=0)
    data_s_per_mtoken: float = Field(default=0.0, ge=0)
    checkpoint_s_per_mparam: float = Field(default=0.0, ge=0)


class NodeProfileInfo(_Measured):
    """What the node measured by running the real worker at registration."""

    startup_s: float = Field(
        ge=0, description="Spawn to first step per idle core: interpreter, imports, rendezvous."
    )
    teardown_s: float = Field(default=0.0, ge=0, description="Result reported to process group gone.")
    physical_cores: int = Field(default=0, ge=0, description="0: unknown (slots are not priced as shared).")
    host_load_factor: float = Field(
        default=0.0, ge=0, description="Wall over CPU time of the reference on a CPU slot; 0: not measured."
    )
    launcher_s: float = Field(
        default=0.0,
        ge=0,
        description="The launcher's part of startup_s per idle core (one process per node); 0: not measured.",
    )
    # A gloo all-reduce between two of the host's CPU ranks (``training.collective_probe``); 0: not
    # measured, the node's data-parallel collectives are priced over the cluster's fabric.
    collective_call_s: float = Field(
        default=0.0, ge=0, description="Seconds of one small all-reduce between two CPU ranks of the host."
    )
    collective_gbps: float = Field(
        default=0.0, ge=0, description="Payload rate of a large all-reduce between two CPU ranks, Gb/s."
    )
    collective_wait_s: float = Field(
        default=0.0,
        ge=0,
        description="Per hop of the ring, the wait for a peer's turn where ranks outnumber the host's cores.",
    )
    rates: dict[Literal["fp32", "bf16"], StepRateInfo] = Field(default_factory=dict)


MAX_HOST_SLOTS = 1e6  # no host runs this many CPU slots: a busy count beyond it is not one


class NodeInfo(_Plain):
    id: str = Field(min_length=1)
    hostname: str = ""
    devices: list[DeviceSlot] = Field(default_factory=list)
    alive: bool = True
    profile: NodeProfileInfo | None = None
    cpu_contention: float | None = Field(
        default=None,
        ge=MIN_CONTENTION,
        allow_inf_nan=False,
        description=(
            "Runnable threads per core on the host, a new CPU worker included (heartbeats): above 1,"
            " how many times slower than an idle core it runs; below 1, cores are left."
        ),
    )
    cpu_contention_busy: float | None = Field(
        default=None,
        ge=0,
        le=MAX_HOST_SLOTS,
        allow_inf_nan=False,
        description=(
            "CPU slots of the host's other nodes busy with jobs when the probes behind"
            " cpu_contention were taken (a mean over them); None: not known, the figure is the host."
        ),
    )
    queue_wait_s: float = Field(
        default=0.0,
        ge=0,
        le=30 * 24 * 3600.0,
        allow_inf_nan=False,
        description="A scheduler-backed node: how long a task submitted now waits in its cluster's queue.",
    )
    # The node's own place in its cluster's fabric, where the agent declared it: a node with a
    # slower NIC (or behind an oversubscribed switch) than the cluster's figure. None: the cluster's.
    fabric_bandwidth_gbps: float | None = Field(
        default=None,
        gt=0,
        le=MAX_FABRIC_GBPS,
        allow_inf_nan=False,
        description="Each device's port into the cluster fabric on this node, Gb/s; the cluster's caps it.",
    )
    fabric_latency_ms: float | None = Field(
        default=None,
        ge=0,
        le=MAX_FABRIC_LATENCY_MS,
        allow_inf_nan=False,
        description="One-way latency from this node across the cluster fabric, ms; at least the cluster's.",
    )
    # The agent declared its torchrun endpoint (advertise host, sync ports) reachable from the
    # region's other clusters: the node may share a replica's pipeline with nodes there.
    cross_cluster_groups: bool = False
    # Whether and how it runs users' code (contracts.registration.SANDBOX_KINDS). The snapshot
    # builders always set it from the node's row (a node that never said is "none"); a snapshot
    # written by hand describes nodes able to run them.
    sandbox: Literal["bubblewrap", "unsandboxed-allowed", "none"] = "bubblewrap"

    @property
    def host(self) -> str:
        """Nodes on one machine (several agents on one host) share its cores."""
        return self.hostname or self.id

    def free_devices(self) -> list[DeviceSlot]:
        return [d for d in self.devices if d.free] if self.alive else []


class ClusterInfo(_Plain):
    id: str = Field(min_length=1)
    name: str = ""
    provider: str = ""
    region: str = Field(min_length=1)
    nodes: list[NodeInfo] = Field(default_factory=list)
    intra_bandwidth_gbps: float = Field(default=100.0, gt=0)
    intra_latency_ms: float = Field(default=0.01, ge=0)
    price_per_device_hour: float = Field(ge=0)
    spot_price_per_device_hour: float | None = Field(default=None, ge=0)

    def free_devices(self) -> list[tuple[NodeInfo, DeviceSlot]]:
        """Free devices on alive nodes, in node then device order."""
        return [(n, d) for n in self.nodes for d in n.free_devices()]

    @property
    def n_free(self) -> int:
        return sum(len(n.free_devices()) for n in self.nodes)

    def port(self, node: NodeInfo) -> tuple[float, float]:
        """(Gb/s, one-way ms) of a device's port into this fabric on ``node``: the cluster's
        figures, narrowed by the node's own where it has them."""
        bw, lat = self.intra_bandwidth_gbps, self.intra_latency_ms
        if node.fabric_bandwidth_gbps is not None:
            bw = min(bw, node.fabric_bandwidth_gbps)
        if node.fabric_latency_ms is not None:
            lat = max(lat, node.fabric_latency_ms)
        return bw, lat

    def between(self, a: NodeInfo, b: NodeInfo) -> tuple[float, float]:
        """(Gb/s, one-way ms) of a message from a device on node a to one on node b across the
        fabric (non-blocking: only the two ports limit it, the slower one sets the rate)."""
        (bw_a, lat_a), (bw_b, lat_b) = self.port(a), self.port(b)
        return min(bw_a, bw_b), max(lat_a, lat_b)


class RegionInfo(_Plain):
    name: str = Field(min_length=1)
    # The jurisdiction an admin approved: the only one data residency trusts.
    jurisdiction: str = ""
    # An agent's claim no admin approved yet: named in the reasons, never trusted.
    jurisdiction_claim: str = ""


class LinkInfo(_Plain):
    """A link between two regions; one direction given means the same both ways."""

    src: str = Field(min_length=1)
    dst: str = Field(min_length=1)
    bandwidth_gbps: float = Field(gt=0)
    latency_ms: float = Field(ge=0)
    egress_price_per_gb: float = Field(default=0.0, ge=0)
    # measured by agents' probes, or declared by an admin
    source: Literal["measured", "declared"] = "declared"
    # Declared private by the providers: only such links carry a torchrun group's gloo/NCCL
    # traffic between clusters (``cross_cluster.private_between``). Undeclared: public.
    private: bool = False


class ResourceSnapshot(_Plain):
    regions: list[RegionInfo] = Field(default_factory=list)
    clusters: list[ClusterInfo] = Field(default_factory=list)
    links: list[LinkInfo] = Field(default_factory=list)
    taken_at: float | None = None

    _links: dict[tuple[str, str], LinkInfo] = PrivateAttr(default_factory=dict)
    _regions: dict[str, RegionInfo] = PrivateAttr(default_factory=dict)
    _derived: dict[str, Any] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _unique_ids(self) -> ResourceSnapshot:
        seen: set[str] = set()
        for c in self.clusters:
            if c.id in seen:
                raise ValueError(f"duplicate cluster id {c.id!r}")
            seen.add(c.id)
        for c in self.clusters:
            node_ids = [n.id for n in c.nodes]
            if len(set(node_ids)) != len(node_ids):
                raise ValueError(f"duplicate node id in cluster {c.id!r}")
            for n in c.nodes:
                idx = [d.index for d in n.devices]
                if len(set(idx)) != len(idx):
                    raise ValueError(f"duplicate device index on node {n.id!r}")
        return self

    def model_post_init(self, __context: object) -> None:
        # Explicit directions win; a lone direction serves both ways.
        links: dict[tuple[str, str], LinkInfo] = {}
        for ln in self.links:
            links[(ln.src, ln.dst)] = ln
        for ln in self.links:
            links.setdefault((ln.dst, ln.src), ln)
        self._links = links
        self._regions = {r.name: r for r in self.regions}

    def link(self, a: str, b: str) -> LinkInfo | None:
        """The link from region a to region b; same region -> the local fabric; None if unknown."""
        # The private dict read directly: ``self._links`` goes through BaseModel.__getattr__, and
        # the estimate asks for links thousands of times a quote.
        found = self.__pydantic_private__["_links"].get((a, b))
        if found is not None:
            return found
        if a == b:
            return LinkInfo(src=a, dst=b, bandwidth_gbps=LOCAL_BANDWIDTH_GBPS, latency_ms=LOCAL_LATENCY_MS)
        return None

    def jurisdiction(self, region: str) -> str:
        r = self._regions.get(region)
        return r.jurisdiction if r else ""

    def jurisdiction_claim(self, region: str) -> str:
        """An agent's claim on the region's jurisdiction that no admin approved ("" if none)."""
        r = self._regions.get(region)
        return r.jurisdiction_claim if r else ""

    def derived(self, name: str, build: Callable[[ResourceSnapshot], T]) -> T:
        """What ``build`` derives from this snapshot, built on first use and kept with it: a
        snapshot is never changed in place (the server hands out the same object while the fleet
        is unchanged), so quotes on it share the work."""
        private = self.__pydantic_private__  # read directly: the quote path calls this often
        kept = private["_derived"]
        if kept.get("__owner__") != id(self):
            # A copy (model_copy) shares its original's dict, not its contents' validity.
            kept = private["_derived"] = {"__owner__": id(self)}
        got = kept.get(name, _MISSING)
        if got is _MISSING:
            got = kept[name] = build(self)
        return got

    def clusters_by_id(self) -> dict[str, ClusterInfo]:
        return self.derived("clusters_by_id", lambda s: {c.id: c for c in s.clusters})

    def nodes_by_id(self) -> dict[str, NodeInfo]:
        return self.derived("nodes_by_id", lambda s: {n.id: n for c in s.clusters for n in c.nodes})

    def region_of(self) -> dict[str, str]:
        """Cluster id -> its region."""
        return self.derived("region_of", lambda s: {c.id: c.region for c in s.clusters})

    def cluster(self, cluster_id: str) -> ClusterInfo:
        return self.clusters_by_id()[cluster_id]

    @classmethod
    def from_json(cls, text: str) -> ResourceSnapshot:
        try:
            return cls.model_validate_json(text)
        except ValidationError as exc:
            raise invalid_argument_from(exc, "resource snapshot") from exc

    def to_json(self, indent: int | None = None) -> str:
        return self.model_dump_json(indent=indent)
