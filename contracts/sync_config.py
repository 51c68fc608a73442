"""``SyncConfig``: the ``sync`` section of a worker config, validated once with field-named errors."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from contracts.errors import InvalidArgument
from contracts.links import LinkSpec, parse_links
from contracts.sync_delay import overlap_delay_steps

MAX_PEM = 16 * 1024  # a certificate or key of any usual size, and no more
# The name every leader's sync certificate carries and every client verifies: certificates name the
# service, not a host (leaders are reached by address and move between nodes).
SYNC_TLS_SERVER_NAME = "cpn-sync"
# The name a job's group certificates carry: the TLS relay of a torchrun group's rendezvous store
# (``training.rendezvous``), reached at the group's head by address.
GROUP_TLS_SERVER_NAME = "cpn-group"

Mode = Literal["none", "sync", "local_sgd", "diloco", "gossip", "ssp", "async"]
Compression = Literal["none", "fp32", "fp16", "bf16", "int8", "topk"]
ANCHORED_MODES = ("local_sgd", "diloco")
OVERLAPPED_MODES = ("diloco", "async")  # the modes a real job overlaps (planner.sync_settings)

# DiLoCo (Douillard et al. 2023): outer Nesterov SGD, lr 0.7, momentum 0.9.
DILOCO_OUTER_LR, DILOCO_OUTER_MOMENTUM = 0.7, 0.9


class StageRing(BaseModel):
    """One pipeline stage's own sync ring: this participant's leader of the stage (the stage's first
    rank) meets the same stage of every other participant and exchanges only that stage's
    parameters or gradients, beside the other stages' rings (``training.sync.stages``)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    stage: int = Field(ge=0)
    # Set only in the config of the node that holds the stage's leader: where it serves its ring.
    listen: str | None = None
    advertise: str | None = None
    peers: dict[str, str] = Field(
        default_factory=dict, description="participant -> host:port of its leader of this stage"
    )
    # The ring over the stage's leaders (each stage's over its own leaders' clusters and regions).
    ring_order: list[str] | None = Field(default=None, max_length=1024)
    hierarchy: dict[str, list[str]] = Field(default_factory=dict, max_length=1024)


def hierarchy_problem(hierarchy: dict[str, list[str]], known: set[str]) -> str | None:
    """Why ``hierarchy`` cannot group the participants ``known``, or None."""
    listed = [p for members in hierarchy.values() for p in members]
    if any(not members for members in hierarchy.values()):
        return f"hierarchy {hierarchy} has a region with no participants"
    if len(set(listed)) != len(listed) or set(listed) != known:
        return f"hierarchy {hierarchy} must list each of {sorted(known)} once"
    return None


class SyncConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    mode: Mode = "none"
    every: int = Field(default=1, gt=0, description="H: local steps between sync events")
    compression: Compression | None = None
    topk_ratio: float = Field(default=0.01, gt=0, le=1)
    int8_block: int = Field(default=2048, gt=0, description="elements per int8 scale")
    error_feedback: bool = True
    # ssp
    staleness: int = Field(default=1, ge=0, description="ssp: rounds a region may run ahead of the slowest")
    # sync / local_sgd / diloco (defaults per mode: diloco 0.7 / 0.9 Nesterov, others plain averaging)
    outer_lr: float | None = Field(default=None, gt=0)
    outer_momentum: float | None = Field(default=None, ge=0, lt=1)
    nesterov: bool = True
    fragments: int = Field(default=1, gt=0, description="diloco: streamed fragments (Streaming DiLoCo)")
    # The fields below left None take a real job's defaults on validation (``_defaults``), so a
    # config built by hand runs like one the control plane filled and its repr shows every value.
    overlap: bool | None = Field(
        default=None,
        description="exchange in the background (default: on for diloco and async, as a real job)",
    )
    overlap_steps: int | None = Field(
        default=None,
        ge=0,
        description="local_sgd / diloco with overlap: steps between a fragment's send and its "
        "application (default: contracts.sync_delay.overlap_delay_steps without link figures, half a "
        "round; pass it the exchange's and a step's seconds for a real job's delay)",
    )
    overlap_merge: Literal["progress", "mix"] | None = Field(
        default=None,
        description="how an overlapped round lands: 'progress' puts the local steps made since the "
        "snapshot on the new anchor; 'mix' sets params = overlap_mix * params + (1 - overlap_mix) * "
        "new anchor (Streaming DiLoCo, Douillard et al. 2025; default for diloco, 'progress' otherwise)",
    )
    overlap_mix: float = Field(default=0.5, ge=0, le=1)
    land_on_arrival: bool | None = Field(
        default=None,
        description="local_sgd / diloco with overlap: apply a round at the first step its result is "
        "in rather than at the fixed delay; needs the region's leader to be its one process "
        "(default: set by training.sync.create_engine from the region's process count)",
    )
    balance: bool | None = Field(
        default=None,
        description="local_sgd / diloco: each region's steps per round follow its measured speed "
        "(the round's total stays regions x H), so regions of unequal speed reach every round's end "
        "together and train different step counts (engine.local_steps); contributions are weighted "
        "by the tokens each region trained. Needs land_on_arrival (default: on where it is on)",
    )
    # gossip
    gossip_protocol: Literal["pairwise", "push_sum"] = "pairwise"
    gossip_peers: int = Field(default=1, gt=0)
    gossip_graph: list[dict[str, list[str]]] | None = Field(
        default=None,
        description="per round (cycled): region -> peers it contacts; default: one-peer "
        "exponential graph over the sorted regions",
    )
    gossip_weight: float | None = Field(default=None, gt=0, le=0.5)
    gossip_check_every: int = Field(
        default=10, gt=0, le=100_000, description="gossip: rounds between spread checks"
    )
    gossip_max_spread: float | None = Field(
        default=None,
        gt=0,
        le=1e6,
        description="gossip: a check that finds the regions' max parameter difference above this "
        "averages them exactly (default: only measure)",
    )
    # sync / local_sgd / diloco with 3+ regions: reduce-scatter then all-gather around this ring
    ring_order: list[str] | None = Field(
        default=None, max_length=1024, description="regions in ring order (default: sorted names)"
    )
    # async
    ps_region: str | None = None
    async_damping: Literal["inverse", "sqrt", "none"] = "inverse"
    # where and how
    region: str | None = None
    listen: str | None = Field(default=None, description="host:port to serve on (default 127.0.0.1:0)")
    advertise: str | None = Field(default=None, description="host:port peers reach this region at")
    peers: dict[str, str] = Field(
        default_factory=dict,
        description="region -> host:port of its leader; an empty address is looked up in rendezvous_dir",
    )
    rendezvous_dir: str | None = None
    auth_secret: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{32,128}$",
        description="the job's shared secret: peers sign every call with it (unset: no peer check)",
    )
    # mutual TLS between the job's leaders: the job's CA, and this leader's certificate and key
    tls_ca_pem: str | None = Field(default=None, max_length=MAX_PEM, description="the job's sync CA (PEM)")
    tls_cert_pem: str | None = Field(
        default=None, max_length=MAX_PEM, description="this leader's certificate"
    )
    tls_key_pem: str | None = Field(default=None, max_length=MAX_PEM, description="this leader's private key")
    insecure: bool = Field(
        default=False,
        description="run without TLS across hosts: plaintext and, without auth_secret, unauthenticated "
        "(without it an engine without TLS material refuses any address off loopback)",
    )
    timeout_s: float = Field(default=30.0, gt=0, description="a peer missing this long is dropped")
    lost_notices: str | None = Field(
        default=None,
        max_length=4096,
        description="file the agent appends the control plane's lost-peer notices to (set by the agent)",
    )
    startup_timeout_s: float = Field(default=120.0, gt=0)
    links: dict[str, LinkSpec] = Field(default_factory=dict, description='"a|b" -> bandwidth and latency')
    kernel_shaping: bool = Field(default=False, description="bandwidth is shaped by tc; latency stays here")
    chunk_bytes: int = Field(default=1 << 20, ge=1024, le=3 << 20)
    # sync / local_sgd / diloco: a hierarchical exchange (training.sync.collective): region -> its
    # participants, head first, regions in the heads' ring order; empty: one flat ring.
    hierarchy: dict[str, list[str]] = Field(default_factory=dict, max_length=1024)
    # Per-stage rings (one per pipeline stage, each listed with its own peers): set where the job's
    # participants sync stage by stage; empty: one leader per participant gathers the whole replica.
    stages: list[StageRing] = Field(default_factory=list, max_length=1024)
    # how the runtime places this cluster's replicas among all of the job's (data sharding)
    global_replicas: int | None = Field(default=None, gt=0)
    replica_offset: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _defaults(self) -> SyncConfig:
        """A real job's defaults for what was left unset (``control_layer.worker_config``)."""
        if self.overlap is None:
            self.overlap = self.mode in OVERLAPPED_MODES
        if self.overlap_merge is None:
            self.overlap_merge = "mix" if self.mode == "diloco" else "progress"
        if (
            self.mode in ANCHORED_MODES
            and self.overlap
            and self.overlap_steps is None
            and self.every % self.fragments == 0
        ):
            self.overlap_steps = overlap_delay_steps(self.round_steps)
        if self.balance is None and self.land_on_arrival is not None:
            self.balance = self.mode in ANCHORED_MODES and self.land_on_arrival
        return self

    @model_validator(mode="after")
    def _consistent(self) -> SyncConfig:
        try:
            parse_links(self.links, set(self.peers) | ({self.region} if self.region else set()) or None)
        except InvalidArgument as e:
            raise ValueError(e.message) from None
        tls = (self.tls_ca_pem, self.tls_cert_pem, self.tls_key_pem)
        if any(tls) and not all(tls):
            raise ValueError("tls_ca_pem, tls_cert_pem and tls_key_pem go together: give all three or none")
        if self.mode == "diloco" and self.every % self.fragments:
            raise ValueError(f"every ({self.every}) must be divisible by fragments ({self.fragments})")
        if self.balance and self.mode not in ANCHORED_MODES:
            raise ValueError("balance applies to modes 'local_sgd' and 'diloco' only")
        if self.balance and self.land_on_arrival is False:
            raise ValueError(
                "balance needs land_on_arrival (balanced round ends only a region whose leader is its "
                "one process can follow): set balance=False, or land_on_arrival=True"
            )
        if self.land_on_arrival and self.mode not in ANCHORED_MODES:
            raise ValueError("land_on_arrival applies to modes 'local_sgd' and 'diloco' only")
        if self.fragments > 1 and self.mode != "diloco":
            raise ValueError("fragments applies to mode 'diloco' only")
        if self.overlap_steps is not None and self.overlap_steps > self.round_steps:
            raise ValueError(
                f"overlap_steps ({self.overlap_steps}) must be <= every // fragments ({self.round_steps})"
            )
        if self.ps_region is not None and self.peers and self.ps_region not in self.peers:
            raise ValueError(f"ps_region {self.ps_region!r} is not among peers {sorted(self.peers)}")
        if self.ring_order is not None:
            if len(set(self.ring_order)) != len(self.ring_order):
                raise ValueError(f"ring_order lists a region twice: {self.ring_order}")
            known = set(self.peers) | {self.region}
            if self.region and set(self.ring_order) != known:
                raise ValueError(
                    f"ring_order {self.ring_order} must list exactly the regions {sorted(known)}"
                )
        known = set(self.peers) | {self.region}
        for where, hierarchy in [("hierarchy", self.hierarchy)] + [
            (f"stages[{r.stage}].hierarchy", r.hierarchy) for r in self.stages
        ]:
            if not hierarchy:
                continue
            if self.mode not in ("sync", "local_sgd", "diloco"):
                raise ValueError(f"{where} applies to modes 'sync', 'local_sgd' and 'diloco' only")
            problem = hierarchy_problem(hierarchy, known) if self.region else None
            if problem:
                raise ValueError(f"{where}: {problem}")
        for ring in self.stages:
            if set(ring.peers) != set(self.peers):
                raise ValueError(
                    f"stages[{ring.stage}].peers {sorted(ring.peers)} must name the participants of"
                    f" sync.peers {sorted(self.peers)}"
                )
            known = set(self.peers) | {self.region}
            if (
                ring.ring_order is not None
                and self.region
                and (set(ring.ring_order) != known or len(ring.ring_order) != len(known))
            ):
                raise ValueError(
                    f"stages[{ring.stage}].ring_order {ring.ring_order} must list each of"
                    f" {sorted(known)} once"
                )
        if self.gossip_graph is not None:
            if not self.gossip_graph:
                raise ValueError("gossip_graph, when given, needs at least one round")
            for i, rnd in enumerate(self.gossip_graph):
                for src, dsts in rnd.items():
                    if src in dsts:
                        raise ValueError(f"gossip_graph[{i}]: region {src!r} lists itself as a peer")
        return self

    @property
    def codec_name(self) -> str:
        return "fp32" if self.compression in (None, "none") else self.compression

    @property
    def round_steps(self) -> int:
        """Steps between two sync events (a fragment's in streaming DiLoCo)."""
        return self.every // self.fragments if self.mode == "diloco" else self.every

    @property
    def delay_steps(self) -> int:
        """Steps between sending a round and applying its result (0: blocking)."""
        if not self.overlap:
            return 0
        return self.overlap_steps if self.overlap_steps is not None else overlap_delay_steps(self.round_steps)

    @property
    def effective_outer_lr(self) -> float:
        if self.outer_lr is not None:
            return self.outer_lr
        return DILOCO_OUTER_LR if self.mode == "diloco" else 1.0

    @property
    def effective_outer_momentum(self) -> float:
        if self.outer_momentum is not None:
            return self.outer_momentum
        return DILOCO_OUTER_MOMENTUM if self.mode == "diloco" else 0.0
