"""The worker's whole configuration, one JSON file per job and cluster.

The control plane builds it (``control_layer.worker_config``), the agent writes it, and
``python -m training.worker --config cfg.json`` (or env ``CPN_WORKER_CONFIG``)
reads it. Everything a worker does is decided here; nothing is read from globals.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from contracts.checkpoint_transfer import MAX_PEM
from contracts.errors import InvalidArgument
from contracts.feasibility import BYO_PARALLELISM, byo_problems, shape_problems, stage_sync_problems
from contracts.model import GPTConfig
from contracts.sync_config import SyncConfig

_STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)
# The process group's timeout in seconds, as the node's agent sets it (agent.nccl_env).
PG_TIMEOUT_ENV = "CPN_PG_TIMEOUT_S"
MAX_TIME_LIMIT_S = 30 * 24 * 3600.0  # a task's time limit (a month) at most
LOOPBACK = ("127.0.0.1", "localhost", "::1")  # where a group may meet without the job's credentials


class DataSpec(BaseModel):
    model_config = _STRICT

    kind: Literal["synthetic-markov", "tokens", "byo"] = "synthetic-markov"
    seed: int = 0
    branching: int = Field(default=4, gt=0)  # markov: successors per state
    concentration: float = Field(default=0.5, gt=0)  # markov: Dirichlet weight of successors
    path: str | None = None  # tokens: flat binary file of token ids
    dtype: Literal["uint16", "uint32"] = "uint16"
    region: str | None = None  # pinned: only workers in this region may read it


class TrainingSpec(BaseModel):
    model_config = _STRICT

    steps: int = Field(gt=0)
    global_batch: int | None = Field(default=None, gt=0)  # sequences per step over all replicas
    local_batch: int | None = Field(default=None, gt=0)  # sequences per step per replica
    micro_batch: int | None = Field(default=None, gt=0)  # sequences per forward (grad accumulation)
    lr: float = Field(default=3e-4, gt=0)
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1)
    warmup: int = Field(default=0, ge=0)
    weight_decay: float = Field(default=0.1, ge=0)
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float | None = Field(default=None, gt=0)
    seed: int = 0  # model init; data streams derive from data.seed
    # bf16: autocast matmuls to bfloat16, weights and optimizer state stay fp32 (as the planner prices)
    precision: Literal["bf16", "fp32"] = "fp32"
    activation_checkpointing: bool = False  # recompute each block's activations in backward


class ParallelSpec(BaseModel):
    model_config = _STRICT

    dp_local: int = Field(default=1, gt=0)  # data-parallel replicas inside this cluster
    tp: int = Field(default=1, gt=0)
    pp: int = Field(default=1, gt=0)
    zero: Literal[0, 1, 2, 3] = 0  # 0 DDP; 1/2 FSDP2 keeping params gathered; 3 FSDP2 resharding
    pp_schedule: Literal["1f1b", "gpipe"] = "1f1b"
    microbatches: int | None = Field(default=None, gt=0)  # pipeline microbatches (default: pp)

    @property
    def world_size(self) -> int:
        return self.dp_local * self.tp * self.pp


MAX_GROUP_NODES = 64  # nodes one torchrun group may span


class NodeGroupSpec(BaseModel):
    """This node's share of a torchrun group spanning several nodes of one cluster (a replica or a
    pipeline that does not fit on one node). Node ranks are fixed, not assigned on arrival, so rank
    blocks (and with them pipeline stages) land on the nodes the plan chose."""

    model_config = _STRICT

    nnodes: int = Field(ge=2, le=MAX_GROUP_NODES)
    node_rank: int = Field(ge=0, lt=MAX_GROUP_NODES)
    # Where node rank 0 hosts the group's rendezvous store (torch's TCPStore).
    master_addr: str = Field(min_length=1, max_length=255)
    master_port: int = Field(gt=0, lt=65536)
    # The job's credentials for the rendezvous (``training.rendezvous``): mutual TLS with the job's
    # CA between the nodes' store connections, and a secret every key of the store sits under.
    # Without them an agent launches the group only on loopback (``agent.workers.rendezvous_args``).
    tls_ca_pem: str | None = Field(default=None, min_length=1, max_length=MAX_PEM)
    tls_cert_pem: str | None = Field(default=None, min_length=1, max_length=MAX_PEM)
    tls_key_pem: str | None = Field(default=None, min_length=1, max_length=MAX_PEM)
    store_secret: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")

    @model_validator(mode="after")
    def _rank_in_group(self) -> NodeGroupSpec:
        if self.node_rank >= self.nnodes:
            raise ValueError(f"group.node_rank ({self.node_rank}) must be < group.nnodes ({self.nnodes})")
        given = [
            x is not None for x in (self.tls_ca_pem, self.tls_cert_pem, self.tls_key_pem, self.store_secret)
        ]
        if any(given) and not all(given):
            raise ValueError("group: tls_ca_pem, tls_cert_pem, tls_key_pem and store_secret go together")
        return self

    @property
    def secured(self) -> bool:
        return self.store_secret is not None


class CheckpointFetch(BaseModel):
    """Where the agent fetches the task's checkpoint from before launching it (a node of its
    region holding a copy) and the ticket that source checks (``contracts.checkpoint_transfer``)."""

    model_config = _STRICT

    transfer_id: str = Field(min_length=1, max_length=64)
    source_node_id: str = Field(min_length=1, max_length=64)
    dir: str = Field(min_length=1, max_length=400)
    step: int = Field(gt=0)
    max_bytes: int = Field(gt=0)
    expires_at: float = Field(gt=0)
    mac: str = Field(min_length=64, max_length=64)
    host: str = Field(min_length=1, max_length=255)
    port: int = Field(gt=0, lt=65536)


class CheckpointTlsSpec(BaseModel):
    """The job's credentials for its checkpoint copies (``contracts.checkpoint_transfer.CheckpointTls``):
    the agent serves this task's checkpoints with them and fetches with them; the worker never sees them."""

    model_config = _STRICT

    ca_pem: str = Field(min_length=1, max_length=MAX_PEM)
    cert_pem: str = Field(min_length=1, max_length=MAX_PEM)
    key_pem: str = Field(min_length=1, max_length=MAX_PEM)


class CheckpointSpec(BaseModel):
    model_config = _STRICT

    # A relative dir is under the agent's work dir (the agent resolves it before launching).
    dir: str | None = Field(default=None, max_length=4096)
    every: int | None = Field(default=None, gt=0)  # steps; the final step is always saved
    keep_last: int = Field(default=2, gt=0)
    resume: bool = True
    # With no checkpoint in dir: the step to begin at, the model coming from the job's surviving
    # regions at the first exchange (a replacement task on a node without its checkpoint).
    start_step: int | None = Field(default=None, ge=0)
    # Resume from the latest complete checkpoint at or before this step: a synchronous job resumes
    # every region from one step, though a region may have finished a later checkpoint.
    resume_at_most: int | None = Field(default=None, ge=0)
    # The node lacks the checkpoint it should resume from: its agent fetches it first.
    fetch: CheckpointFetch | None = None
    tls: CheckpointTlsSpec | None = None


class StageItem(BaseModel):
    """One blob the agent brings to the node before launch: from a signed URL (the artifact
    store's, or a presigned bucket URL), a user's https URL, or a node-local ``file://`` path."""

    model_config = _STRICT

    url: str = Field(min_length=1, max_length=8192)
    digest: str | None = None  # sha256:<hex> the bytes must match (None: an https/file source without one)
    bytes: int | None = Field(default=None, ge=0)  # expected size, where known (progress, bounds)
    region: str | None = None  # a resident shard's region: only a task there may read it


class OutputTarget(BaseModel):
    """Where the agent uploads one output file the leader wrote (a signed ``put`` URL)."""

    model_config = _STRICT

    url: str = Field(min_length=1, max_length=8192)
    max_bytes: int = Field(gt=0)


class StageSpec(BaseModel):
    """What the agent stages before launch and uploads after: the user's code (unpacked, on
    ``sys.path``), a venv for its requirements, this task's data, and the job's outputs."""

    model_config = _STRICT

    code: StageItem | None = None
    requirements_digest: str | None = None  # sha256 of the archive's requirements.txt: the venv's key
    data: StageItem | None = None  # the agent sets data.path to the staged file
    # output file name -> where to upload it; only the task that holds the final model gets these
    outputs: dict[str, OutputTarget] = Field(default_factory=dict)
    sandbox: bool = True  # user code: run the workers under the node's sandbox


_ENTRYPOINT = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class WorkerConfig(BaseModel):
    model_config = _STRICT

    job_id: str = Field(min_length=1)
    region: str = Field(min_length=1)
    cluster: str = Field(min_length=1)
    model: GPTConfig | None = None
    data: DataSpec = Field(default_factory=DataSpec)
    training: TrainingSpec
    parallel: ParallelSpec = Field(default_factory=ParallelSpec)
    sync: SyncConfig = Field(default_factory=SyncConfig)
    metrics_path: str | None = None
    # At most one metrics line this often (0: every step); each line carries the run's byte totals.
    metrics_interval_s: float = Field(default=0.0, ge=0.0, le=60.0)
    # From the quote (``control_layer.worker_config.quoted_time_limit_s``): the longest a
    # scheduler-backed node lets the task run (Slurm's ``--time``); None: the agent's default.
    time_limit_s: float | None = Field(default=None, gt=0.0, le=MAX_TIME_LIMIT_S)
    # From the quote (``control_layer.worker_config.start_within_s``): a scheduler-backed node
    # gives up on a task its scheduler has not started by then (re-placed elsewhere); None: waits.
    start_within_s: float | None = Field(default=None, gt=0.0, le=MAX_TIME_LIMIT_S)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    entrypoint: str | None = None  # bring your own: "package.module:function"
    group: NodeGroupSpec | None = None  # None: the group is this node's alone
    # Set by the agent: once this file exists the job is being preempted, and the workers write a
    # checkpoint at the next step boundary and exit (``training.preemption``).
    preempt_file: str | None = Field(default=None, max_length=4096)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    stage: StageSpec | None = None  # users' code, data and outputs (see StageSpec)
    # Set by the agent: where the leader writes the final model (model.safetensors + config.json)
    # and anything else it leaves for upload; None: no outputs are written.
    outputs_dir: str | None = Field(default=None, max_length=4096)

    @model_validator(mode="after")
    def _consistent(self) -> WorkerConfig:
        if self.entrypoint is None and self.model is None:
            raise ValueError("model is required unless an entrypoint supplies one")
        if self.entrypoint is not None and not _ENTRYPOINT.match(self.entrypoint):
            raise ValueError(f"entrypoint must look like 'package.module:function', got {self.entrypoint!r}")
        if self.data.kind == "tokens" and not self.data.path and not (self.stage and self.stage.data):
            # With stage.data the agent stages the file and sets data.path before the launch.
            raise ValueError("data.path is required when data.kind is 'tokens' (or stage.data to stage it)")
        if (self.data.kind == "byo") != (self.entrypoint is not None):
            raise ValueError("data.kind 'byo' and entrypoint go together: set both or neither")
        p = self.parallel
        # The rules the planner and the control plane apply too (contracts.feasibility).
        problems = byo_problems(
            entrypoint=self.entrypoint is not None,
            supports=BYO_PARALLELISM,
            tp=p.tp,
            pp=p.pp,
            zero=p.zero,
            activation_checkpointing=self.training.activation_checkpointing,
        )
        if self.model is not None and self.entrypoint is None:
            m = self.model
            problems += shape_problems(
                n_heads=m.n_heads,
                n_layers=m.n_layers,
                d_model=m.d_model,
                mlp_ratio=m.mlp_ratio,
                tp=p.tp,
                pp=p.pp,
            )
        problems += stage_sync_problems(
            mode=self.sync.mode, pp=p.pp, stages=[r.stage for r in self.sync.stages]
        )
        if problems:
            raise ValueError("; ".join(problems))
        if self.replica_offset + self.parallel.dp_local > self.global_replicas:
            raise ValueError(
                f"sync.replica_offset ({self.replica_offset}) + parallel.dp_local ({self.parallel.dp_local})"
                f" exceeds sync.global_replicas ({self.global_replicas})"
            )
        t = self.training
        if t.global_batch is None and t.local_batch is None:
            raise ValueError("training: set global_batch or local_batch")
        if t.global_batch is not None:
            if t.global_batch % self.global_replicas:
                raise ValueError(
                    f"training.global_batch ({t.global_batch}) must be divisible by the"
                    f" {self.global_replicas} global replicas"
                )
            if t.local_batch is not None and t.local_batch * self.global_replicas != t.global_batch:
                raise ValueError(
                    f"training.local_batch ({t.local_batch}) x {self.global_replicas} replicas"
                    f" != training.global_batch ({t.global_batch})"
                )
        if t.micro_batch is not None and self.local_batch % t.micro_batch:
            raise ValueError(
                f"training.local_batch ({self.local_batch}) must be divisible by"
                f" micro_batch ({t.micro_batch})"
            )
        if self.parallel.pp > 1 and self.microbatches < self.parallel.pp:
            raise ValueError(
                f"parallel.microbatches ({self.microbatches}) must be >= pp ({self.parallel.pp})"
                " to fill the pipeline"
            )
        sync_region = self.sync.region
        if sync_region is not None and sync_region != self.region:
            raise ValueError(f"sync.region ({sync_region!r}) differs from region ({self.region!r})")
        if self.parallel.pp > 1 and self.local_batch % self.microbatches:
            raise ValueError(
                f"training.local_batch ({self.local_batch}) must be divisible by"
                f" parallel.microbatches ({self.microbatches})"
            )
        return self

    @property
    def global_replicas(self) -> int:
        return self.sync.global_replicas or self.parallel.dp_local

    @property
    def replica_offset(self) -> int:
        return self.sync.replica_offset

    @property
    def local_batch(self) -> int:
        t = self.training
        return t.local_batch if t.local_batch is not None else t.global_batch // self.global_replicas  # type: ignore[operator]

    @property
    def micro_batch(self) -> int:
        return self.training.micro_batch or self.local_batch

    @property
    def microbatches(self) -> int:
        return self.parallel.microbatches or self.parallel.pp


def parse_worker_config(raw: dict[str, Any]) -> WorkerConfig:
    try:
        return WorkerConfig.model_validate(raw)
    except ValidationError as e:
        fields = [".".join(str(p) for p in err["loc"]) or "<root>" for err in e.errors()]
        raise InvalidArgument(f"invalid worker config: {e}", fields=fields) from None


def load_worker_config(path: str | os.PathLike[str] | None = None) -> WorkerConfig:
    """From ``path``, else from the file named by env ``CPN_WORKER_CONFIG``."""
    path = path or os.environ.get("CPN_WORKER_CONFIG")
    if not path:
        raise InvalidArgument("no worker config: pass --config PATH or set CPN_WORKER_CONFIG", field="config")
    p = Path(path)
    try:
        raw = json.loads(p.read_text())
    except FileNotFoundError:
        raise InvalidArgument(f"worker config file not found: {p}", field="config") from None
    except json.JSONDecodeError as e:
        raise InvalidArgument(f"worker config {p} is not valid JSON: {e}", field="config") from None
    return parse_worker_config(raw)
