"""What the planner returns: complete, priced options, and the calibration it can be given."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator


class _Plain(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _fill_and_check_total(data: Any, parts: tuple[str, ...], what: str) -> Any:
    """Fill a missing total with the sum of its parts; refuse a total that is not that sum."""
    if not isinstance(data, dict):
        return data
    total = sum(float(data.get(p) or 0.0) for p in parts)
    given = data.get("total")
    if given is None:
        return {**data, "total": total}
    if not math.isclose(float(given), total, rel_tol=1e-9, abs_tol=1e-9):
        raise ValueError(f"{what}.total ({given}) is not the sum of its parts ({total})")
    return data


def _without_unset_staging(handler: Any, model: BaseModel, names: tuple[str, ...]) -> Any:
    """Dump ``model`` leaving out the named fields that are None (staging, a grouping's bound): an
    option without them reads exactly as before they were priced (quotes, digests, stored options)."""
    out = handler(model)
    if isinstance(out, dict):
        for name in names:
            if out.get(name, 0) is None:
                del out[name]
    return out


Slot = tuple[str, str, int]  # a device a task runs on: cluster id, node id, device index


class PlannedTask(_Plain):
    """One device's role: which replica, pipeline stage and tensor shard it runs, and where."""

    dp_rank: int = Field(ge=0)
    pp_stage: int = Field(ge=0)
    tp_rank: int = Field(ge=0)
    cluster: str
    node: str
    device: int = Field(ge=0)
    region: str = ""


MAX_QUEUE_WAIT_S = 30 * 24 * 3600.0  # a learned queue-wait correction, at most a month either way


# Every field of a task: the set a task the planner lays out reports as set (shared: never changed).
_TASK_FIELDS = set(PlannedTask.model_fields)


def laid_out_tasks(rows: list[dict[str, Any]]) -> list[PlannedTask]:
    """Tasks the planner laid out itself on a validated snapshot: each row holds every field,
    plain ints ≥ 0 and the snapshot's own ids. Built as ``PlannedTask.model_construct`` builds a
    model, without validating each field again: an option holds thousands of tasks, and a quote
    lays out tasks for every option it prices (their validation took a tenth of a 70B quote).
    Tasks from outside the planner (a request, a stored plan) are validated as any model is."""
    new, set_attr = PlannedTask.__new__, object.__setattr__
    out = []
    for row in rows:
        task = new(PlannedTask)
        set_attr(task, "__dict__", row)
        set_attr(task, "__pydantic_fields_set__", _TASK_FIELDS)
        set_attr(task, "__pydantic_extra__", None)
        set_attr(task, "__pydantic_private__", None)
        out.append(task)
    return out


STEP_PARTS = (
    "data",
    "compute",
    "optimizer",
    "tp_comm",
    "dp_comm",
    "pp_bubble",
    "pp_comm",
    "wan_sync",
    "checkpoint",
)


class StepBreakdown(_Plain):
    """Seconds per optimizer step on the slowest replica; total is the sum of the parts.

    data is sampling the step's batch; compute is forward and backward (with the fixed costs per
    micro-batch and per step); optimizer the AdamW step; dp_comm is the gradient all-reduce (or
    ZeRO reduce-scatter/all-gather) among the replicas of one node; wan_sync is the amortised
    synchronisation between nodes and regions; checkpoint the amortised checkpoint writes.
    """

    data: float = Field(default=0.0, ge=0)
    compute: float = Field(ge=0)
    optimizer: float = Field(default=0.0, ge=0)
    tp_comm: float = Field(default=0.0, ge=0)
    dp_comm: float = Field(default=0.0, ge=0)
    pp_bubble: float = Field(default=0.0, ge=0)
    pp_comm: float = Field(default=0.0, ge=0)
    wan_sync: float = Field(default=0.0, ge=0)
    checkpoint: float = Field(default=0.0, ge=0)
    total: float = Field(ge=0)

    @model_validator(mode="before")
    @classmethod
    def _total(cls, data: Any) -> Any:
        return _fill_and_check_total(data, STEP_PARTS, "step_s")


class CostBreakdown(_Plain):
    """USD for the whole run; total is the sum of the parts. staging_egress: the source's egress
    for the staged bytes that cross a region boundary (None: the job stages no data)."""

    devices: float = Field(ge=0)
    egress: float = Field(default=0.0, ge=0)
    staging_egress: float | None = Field(default=None, ge=0)
    total: float = Field(ge=0)

    @model_validator(mode="before")
    @classmethod
    def _total(cls, data: Any) -> Any:
        return _fill_and_check_total(data, ("devices", "egress", "staging_egress"), "cost")

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> Any:
        return _without_unset_staging(handler, self, ("staging_egress",))


class StagedRead(_Plain):
    """One node's staging as priced: what it reads, from where, and how long that takes:
    ``fetches`` × ``fetch_fixed_s`` + ``bytes`` / ``bytes_per_s`` + ``venv_s``."""

    node: str
    region: str
    items: list[str] = Field(description="Spec fields staged: 'code', 'data.source', 'data.shards.<region>'.")
    cached: list[str] = Field(
        default_factory=list, description="Items (and 'venv') the node's cache holds: nothing to stage."
    )
    bytes: int = Field(ge=0, description="Bytes fetched (what the cache holds left out).")
    bytes_per_s: float = Field(gt=0)
    rate_basis: str = Field(
        description="'learned' (its staging), 'measured' (its agent's store probe) or the link guessed from"
    )
    fetches: int = Field(default=0, ge=0)
    fetch_fixed_s: float = Field(default=0.0, ge=0, description="Seconds one fetch takes beyond its bytes.")
    fixed_basis: str = Field(default="", description="'learned', 'measured' or 'default'.")
    venv_s: float = Field(
        default=0.0, ge=0, description="The venv build: its CPU seconds at the host share (× share)."
    )
    venv_basis: str = Field(default="", description="'learned', 'measured' or 'default'; '' without a build.")
    share: float = Field(default=1.0, ge=1, description="The host share the node's CPU work was priced at.")
    seconds: float = Field(ge=0)
    crossing_bytes: int = Field(default=0, ge=0, description="Bytes that cross a region boundary.")
    egress_usd: float = Field(default=0.0, ge=0)


class StagingEstimate(_Plain):
    """Staging before training starts (``control_layer.planner.staging``): the nodes stage in
    parallel, so the slowest sets ``seconds`` (each node's, ``StagedRead``). ``unknown`` lists
    items whose size is not known (file:// on the node: nothing to fetch)."""

    seconds: float = Field(ge=0)
    bytes: int = Field(ge=0, description="Over all nodes.")
    crossing_bytes: int = Field(default=0, ge=0)
    egress_usd: float = Field(default=0.0, ge=0)
    reads: list[StagedRead] = Field(default_factory=list)
    shard_of_region: dict[str, str] = Field(
        default_factory=dict, description="Per region used: the shard its tasks read (data.shards)."
    )
    unknown: list[str] = Field(default_factory=list)


class EstimateInterval(_Plain):
    """Where the actual is expected to land: the estimate scaled by recent relative errors.

    low/high are the p10/p90 of (actual − estimate) / estimate over recent finished jobs, or a wide
    default band when there are too few of them (``residuals`` says how many were used).
    """

    duration_s_low: float = Field(ge=0)
    duration_s_high: float = Field(ge=0)
    cost_low: float = Field(ge=0)
    cost_high: float = Field(ge=0)
    residuals: int = Field(default=0, ge=0)


class ExchangeBasis(_Plain):
    """How one cross-region exchange was priced: t = local_s + bytes / bytes_per_s + latency_s +
    (fixed_s + rounds × call_s + params × param_s) × share. bytes cross the slowest link
    (bytes_per_s, achieved: nominal × goodput); fixed_s is the exchange's fixed cost whatever its
    size (per idle core); rounds are the calls each leader makes one after another; call_s
    is the fixed cost of one (per idle core); params the model's parameters and param_s the
    leader's work per parameter beyond the transfer (per idle core); share the host share of the
    slowest leader's node; blocking says whether the steps wait for the whole exchange (not an
    overlapped one)."""

    local_s: float = Field(default=0.0, ge=0)
    bytes: float = Field(default=0.0, ge=0)
    bytes_per_s: float = Field(default=0.0, ge=0)
    latency_s: float = Field(default=0.0, ge=0)
    rounds: int = Field(default=0, ge=0)
    call_s: float = Field(default=0.0, ge=0)
    fixed_s: float = Field(default=0.0, ge=0)
    params: float = Field(default=0.0, ge=0)
    param_s: float = Field(default=0.0, ge=0)
    share: float = Field(default=1.0, ge=1)
    # Steps between exchanges (H; 1 for modes that exchange every step) and the drift priced: the
    # wait for the slowest region at an exchange, a fraction of the H local steps before it plus
    # fixed seconds per round per idle core (``drift_fit``).
    every: int = Field(default=1, ge=1)
    drift: float = Field(default=0.0, ge=0)
    drift_fixed_s: float = Field(default=0.0, ge=0)
    blocking: bool = True
    # Rings run at once (per-stage sync, ``sync_cost.stage_sync_cost``: bytes and bytes_per_s are
    # then the most loaded pipe's, all rings' bytes through it); 1: one ring.
    rings: int = Field(default=1, ge=1)
    # Hierarchical (``cost_model.hierarchical_parts``): local_s is the members' push to their
    # region's head and its answer back; bytes, rate, latency and rounds are the heads' ring's.
    hierarchical: bool = False


class CalibrationBasis(_Plain):
    """The factors an estimate was made with, so a finished run can be compared like with like.

    efficiency: per "model|precision" of the devices used; startup_s: per node (absent when the
    node has no calibrated figure); goodput: per "regionA|regionB" among the regions used.
    """

    efficiency: dict[str, float] = Field(default_factory=dict)
    startup_s: dict[str, float] = Field(default_factory=dict)
    goodput: dict[str, float] = Field(default_factory=dict)
    # Per node: how many times slower than on an idle core this plan runs, starts and stops there
    # (its CPU slots taking turns on the host's cores with what else runs there).
    host_share: dict[str, float] = Field(default_factory=dict)
    # Per node: the same for the launcher's part of the start-up (one process per node then), and
    # that part's seconds per idle core in force (calibrated, else measured; 0: not measured).
    launch_share: dict[str, float] = Field(default_factory=dict)
    launcher_s: dict[str, float] = Field(default_factory=dict)
    teardown_s: dict[str, float] = Field(default_factory=dict)
    # Per "regionA|regionB" among the regions used: the fixed seconds per exchange call in force,
    # the seconds per parameter of the exchange's per-parameter work, the fixed seconds per exchange.
    exchange_s: dict[str, float] = Field(default_factory=dict)
    exchange_fixed_s: dict[str, float] = Field(default_factory=dict)
    exchange_param_s: dict[str, float] = Field(default_factory=dict)
    exchange_drift: dict[str, float] = Field(default_factory=dict)
    exchange_drift_fixed_s: dict[str, float] = Field(default_factory=dict)
    # Per node: the fixed seconds of one checkpoint write in force, per idle core.
    checkpoint_fixed_s: dict[str, float] = Field(default_factory=dict)
    exchange: ExchangeBasis | None = None


class Estimates(_Plain):
    """What a run of the option takes and costs.

    duration_s is queue_wait_s (a scheduler-backed node's queue, where the option has one; not
    billed) + the span the ledger bills: staging_s (the slowest node bringing its code and
    data, where the job stages any) + startup_s (the slowest node's spawn to first step) +
    steps × step_s.total + final_sync_s (the exchange that produces the final model and leaving the
    peers, where not already in the steps) + teardown_s (the result to the processes gone).
    """

    step_s: StepBreakdown
    steps: int = Field(gt=0)
    startup_s: float = Field(default=0.0, ge=0)
    final_sync_s: float = Field(default=0.0, ge=0)
    teardown_s: float = Field(default=0.0, ge=0)
    duration_s: float = Field(ge=0)
    cost: CostBreakdown
    memory_per_device_gb: float = Field(ge=0, description="Peak on the fullest device.")
    tokens_per_s: float = Field(ge=0)
    wan_bytes_per_step: float = Field(ge=0, description="Bytes crossing region boundaries, amortised.")
    interval: EstimateInterval | None = None
    basis: CalibrationBasis | None = None
    # None (and left out of the dump): the job stages no data (``control_layer.planner.staging``).
    staging_s: float | None = Field(default=None, ge=0)
    staging: StagingEstimate | None = None
    # None (and left out of the dump): no node of the option has a queue
    # (``control_layer.planner.queue_wait``).
    queue_wait_s: float | None = Field(default=None, ge=0)

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> Any:
        return _without_unset_staging(handler, self, ("staging_s", "staging", "queue_wait_s"))

    @property
    def hours(self) -> float:
        return self.duration_s / 3600.0


class SyncTopology(_Plain):
    mode: str
    ring: list[str] = Field(default_factory=list, description="Cluster ids in ring order.")
    gossip: dict[str, list[str]] = Field(default_factory=dict, description="Cluster id -> peer cluster ids.")
    compression: str = "none"
    every: int = 1
    hierarchical: bool = Field(
        default=False,
        description="Dense modes: a region's participants reduce to its first in the ring, those "
        "heads ring over the WAN, and each hands the result back (priced faster than one flat ring).",
    )
    loss_ratio: float | None = Field(
        default=None,
        description="Expected held-out loss over synchronous data parallelism at equal tokens "
        "(control_layer.planner.quality; None: not measured for this setting).",
    )
    loss_ratio_basis: str = Field(default="", description="The measured setting loss_ratio comes from.")
    loss_penalty: float | None = Field(
        default=None,
        description="Held-out loss over fp32 blocking at the same H, minus 1, of this codec and "
        "overlap (control_layer.planner.calibrated; None: not known for this mode or setting).",
    )
    loss_penalty_low: float | None = Field(default=None, description="95 % interval, low end (None: none).")
    loss_penalty_high: float | None = Field(default=None, description="95 % interval, high (None: none).")
    loss_penalty_source: str = Field(
        default="",
        description="measured (this job's calibration), table (one model's measurements: confidence "
        "unknown), reference (fp32 blocking itself) or unknown.",
    )
    loss_penalty_basis: str = Field(default="", description="What the penalty was measured on.")


class RuntimeSettings(_Plain):
    """What the runtime is told beyond the plan's shape: how often to checkpoint and how to
    overlap the WAN exchange (``control_layer.planner.runtime_settings``); the workers get exactly
    these (``control_layer.worker_config``)."""

    checkpoint_every: int = Field(gt=0, description="Steps between checkpoints.")
    checkpoint_write_s: float = Field(ge=0, description="Estimated seconds one checkpoint write takes.")
    checkpoint_fraction: float = Field(ge=0, description="Estimated share of the run spent writing them.")
    overlap: bool = Field(default=False, description="The WAN exchange runs behind the next steps.")
    overlap_steps: int | None = Field(
        default=None, ge=0, description="Steps between a round's send and its application (with overlap)."
    )
    fragments: int = Field(default=1, gt=0, description="DiLoCo: streamed fragments per outer round.")
    overlap_merge: Literal["progress", "mix"] | None = Field(
        default=None,
        description="DiLoCo with overlap: how a late round lands (contracts.sync_delay.overlap_merge_for); "
        "None (options planned before it was chosen): mix.",
    )
    reason: str = ""
    # The sync settings the spec left to the planner ("auto"), as chosen for this option
    # (``planner.sync_choice``); None where the spec set them. ``sync`` of the option states them too.
    sync_every: int | None = Field(default=None, gt=0, description="H the planner chose.")
    sync_compression: str | None = Field(default=None, description="The codec the planner chose.")
    sync_choice: str = Field(default="", description="Why the planner chose them.")


class QosCheck(_Plain):
    name: str
    ok: bool
    detail: str = ""


class GroupingBound(_Plain):
    """How far a spanning option's grouping of nodes into replicas can be from the best one
    (``control_layer.planner.grouping``): no grouping of the same nodes, each node one replica's,
    has a slowest replica faster than ``lower_bound_s``."""

    slowest_replica_s: float = Field(
        ge=0, description="The slowest replica's step from compute to stage transfers, as priced."
    )
    lower_bound_s: float = Field(ge=0, description="No grouping of these nodes does better.")
    gap: float = Field(ge=0, description="slowest_replica_s / lower_bound_s - 1: how far from optimal.")
    exact: bool = Field(description="Every composition was priced in every stage order: the bound is tight.")
    compositions: int = Field(ge=0, description="Replica compositions the search priced.")


class PlanOption(_Plain):
    id: str
    label: Literal["cheapest", "fastest", "balanced"] | None = None
    dp: int = Field(gt=0)
    tp: int = Field(gt=0)
    pp: int = Field(gt=0)
    zero: int = Field(ge=0, le=3)
    pp_schedule: str = "1f1b"
    micro_batch_size: int = Field(default=1, gt=0)
    n_micro_batches: int = Field(default=1, gt=0, description="Micro-batches per replica per step.")
    spot: bool = False
    precision: Literal["bf16", "fp32"] = Field(
        default="fp32",
        description="What the workers train at: the spec's precision, resolved for these devices.",
    )
    activation_checkpointing: bool = False
    replicas_per_cluster: dict[str, int]
    tasks: list[PlannedTask]
    sync: SyncTopology
    estimates: Estimates
    qos_checks: list[QosCheck] = Field(default_factory=list)
    regions: list[str] = Field(default_factory=list)
    runtime: RuntimeSettings | None = None
    # Replicas across nodes only (``spanning``): the grouping's bound; None (and left out of the
    # dump) elsewhere, so other options read as before.
    grouping: GroupingBound | None = None

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> Any:
        return _without_unset_staging(handler, self, ("grouping",))

    @property
    def n_devices(self) -> int:
        return len(self.tasks)


class ErrorBand(_Plain):
    """p10/p90 of recent relative errors (actual − estimate) / estimate, and how many there were."""

    p10: float = Field(ge=-1)
    p90: float = Field(ge=-1)
    n: int = Field(ge=0)


class Calibration(_Plain):
    """Achieved-vs-nominal factors learned from finished runs; they override the defaults.

    device_efficiency: achieved fraction of measured TFLOPS, keyed "model|precision" (learned per
    precision) or "model" (any precision); both case-insensitive, the precise key first.
    link_goodput: per "regionA|regionB" (either order), achieved fraction of nominal bandwidth.
    startup_s: per node id, the workers' seconds from their spawn to the first step (interpreter,
    imports, rendezvous, model build) per idle core; launcher_s: per node id, the launcher's seconds
    before it spawns them (torchrun's interpreter and imports, one process per node) per idle core;
    teardown_s: per node id, seconds from the worker's result to its exit, likewise.
    link_goodput keys ending in "|measured" apply to a measured link (a fraction of what the probe
    achieved), plain keys to a declared one. exchange_s: per region pair, the fixed seconds of one
    call of a cross-region exchange (framing, auth, thread hand-offs, waiting for the peer's
    threads) per idle core, beyond its bytes and the link's latency; exchange_param_s: per region
    pair, the leader's seconds per parameter of an exchange (flatten, codec, mean, in-node
    broadcast) per idle core; exchange_fixed_s: per region pair, the seconds one exchange costs
    whatever its size and ring (the loop over the parameter tensors, fingerprints, waking threads)
    per idle core; exchange_drift: per region pair, the wait for the slowest region at an
    exchange made every H steps, as a fraction of the H local steps before it; exchange_drift_fixed_s:
    per region pair, the part of that wait that does not grow with the round, seconds per round per
    idle core (the lag per round is exchange_drift × H × T_local + exchange_drift_fixed_s × share);
    both keyed "a|b|overlapped" for rounds that overlap the steps, learned apart from blocking ones.
    checkpoint_fixed_s: per node id, the seconds one checkpoint write costs whatever the model's
    size (opening and syncing files, the writer's set-up) per idle core.
    time_error / cost_error: the spread of recent quotes' errors, for the interval every quote carries.
    """

    device_efficiency: dict[str, float] = Field(default_factory=dict)
    link_goodput: dict[str, float] = Field(default_factory=dict)
    startup_s: dict[str, float] = Field(default_factory=dict)
    launcher_s: dict[str, float] = Field(default_factory=dict)
    teardown_s: dict[str, float] = Field(default_factory=dict)
    exchange_s: dict[str, float] = Field(default_factory=dict)
    exchange_param_s: dict[str, float] = Field(default_factory=dict)
    exchange_fixed_s: dict[str, float] = Field(default_factory=dict)
    exchange_drift: dict[str, float] = Field(default_factory=dict)
    exchange_drift_fixed_s: dict[str, float] = Field(default_factory=dict)
    checkpoint_fixed_s: dict[str, float] = Field(default_factory=dict)
    # Per node id, learned from its tasks' staging (``control_layer.planner.staging``; before any,
    # its agent's store probe): the store's bytes/s to it beyond a fetch's fixed seconds, those
    # seconds, and a venv build's CPU seconds (per idle core).
    staging_bytes_per_s: dict[str, float] = Field(default_factory=dict)
    staging_fixed_s: dict[str, float] = Field(default_factory=dict)
    venv_s: dict[str, float] = Field(default_factory=dict)
    # Per node id (a Slurm cluster is one node to cpn): how far the queue waits its tasks measured
    # landed from what its agent reported at submission (seconds, either sign), added to its
    # reports in quotes (``control_layer.planner.queue_wait``).
    queue_wait_s: dict[str, float] = Field(default_factory=dict)
    time_error: ErrorBand | None = None
    cost_error: ErrorBand | None = None

    @model_validator(mode="after")
    def _fractions(self) -> Calibration:
        for table, name in (
            (self.device_efficiency, "device_efficiency"),
            (self.link_goodput, "link_goodput"),
        ):
            for key, value in table.items():
                if not 0 < value <= 1.5:
                    raise ValueError(f"{name}[{key!r}] = {value} is outside (0, 1.5]")
        for name, seconds in (
            ("startup_s", self.startup_s),
            ("launcher_s", self.launcher_s),
            ("teardown_s", self.teardown_s),
            ("exchange_s", self.exchange_s),
            ("exchange_param_s", self.exchange_param_s),
            ("exchange_fixed_s", self.exchange_fixed_s),
            ("exchange_drift", self.exchange_drift),
            ("exchange_drift_fixed_s", self.exchange_drift_fixed_s),
            ("checkpoint_fixed_s", self.checkpoint_fixed_s),
            ("staging_fixed_s", self.staging_fixed_s),
            ("venv_s", self.venv_s),
        ):
            for key, value in seconds.items():
                if not (math.isfinite(value) and value >= 0):
                    raise ValueError(f"{name}[{key!r}] = {value} is not a non-negative number of seconds")
        for key, value in self.queue_wait_s.items():
            if not (math.isfinite(value) and abs(value) <= MAX_QUEUE_WAIT_S):
                raise ValueError(f"queue_wait_s[{key!r}] = {value} is not a number of seconds within a month")
        for key, value in self.staging_bytes_per_s.items():
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"staging_bytes_per_s[{key!r}] = {value} is not a positive rate")
        return self
