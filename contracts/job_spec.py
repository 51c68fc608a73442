"""The job spec: what a user asks for (also the REST request body).

Every model forbids unknown keys and constrains its fields, so a bad spec fails at the edge
with an error that names the field.
"""

from __future__ import annotations

import functools
import json
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from contracts import artifacts
from contracts.artifacts import MAX_URI, DataUri
from contracts.errors import InvalidArgument
from contracts.feasibility import BYO_DEFAULT_PARALLELISM, byo_parallelism_problems, byo_problems
from contracts.model import gpt_param_count, model_config
from contracts.sync_calibration import SyncCalibration

# Every number has bounds and every float is finite: a spec that passes here cannot make a worker,
# a planner or a database fail later. The maxima are far beyond any real job.
SEED_MAX = 2**63 - 1
_Name = Annotated[str, Field(min_length=1, max_length=64)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ModelSpec(_Strict):
    family: Literal["gpt"] = "gpt"
    n_layers: int = Field(gt=0, le=1024)
    d_model: int = Field(gt=0, le=65_536)
    n_heads: int = Field(gt=0, le=1024)
    vocab: int = Field(gt=1, le=1 << 22)
    seq_len: int = Field(gt=0, le=1 << 20)

    @model_validator(mode="after")
    def _heads_divide_width(self) -> ModelSpec:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        return self

    @property
    def n_params(self) -> int:
        """Parameters of the model the worker builds from this spec (see ``contracts.model``)."""
        return _param_count(self)


@functools.lru_cache(maxsize=256)
def _param_count(spec: ModelSpec) -> int:
    # Specs are frozen (hashable); the planner asks for the count thousands of times per quote.
    return gpt_param_count(model_config(spec))


def parse_uri(value: str, field: str) -> DataUri:
    """``contracts.artifacts.parse_uri`` for a validator: its error as the ValueError pydantic reports."""
    try:
        return artifacts.parse_uri(value, field)
    except InvalidArgument as exc:
        raise ValueError(exc.message.removeprefix(f"{field}: ")) from None


def check_digest(value: str, field: str) -> str:
    try:
        return artifacts.check_digest(value, field)
    except InvalidArgument as exc:
        raise ValueError(exc.message.removeprefix(f"{field}: ")) from None


class ShardSpec(_Strict):
    """One region's part of the data. A resident shard is read only by tasks in its region: its
    bytes never cross a region boundary, only model updates do."""

    uri: str = Field(
        max_length=MAX_URI, description="artifact:sha256:..., s3://bucket/key, https://..., file:///path"
    )
    resident: bool = True
    sha256: str | None = Field(default=None, description="sha256:<hex> the fetched bytes must match")

    @field_validator("uri")
    @classmethod
    def _uri(cls, value: str) -> str:
        parse_uri(value, "uri")
        return value

    @field_validator("sha256")
    @classmethod
    def _digest(cls, value: str | None) -> str | None:
        return value if value is None else check_digest(value, "sha256")


MAX_SHARDS = 64


class DataSpec(_Strict):
    kind: Literal["synthetic-markov", "tokens"] = "synthetic-markov"
    seed: int = Field(default=0, ge=0, le=SEED_MAX)
    path: str | None = Field(default=None, max_length=4096)
    region: str | None = Field(
        max_length=64,
        default=None,
        description="Region where the data lives; the tasks that read it must run there.",
    )
    dtype: Literal["uint16", "uint32"] = "uint16"
    source: str | None = Field(
        default=None,
        max_length=MAX_URI,
        description="One dataset every replica reads its part of: artifact:sha256:..., s3://, https://, file://.",
    )
    sha256: str | None = Field(default=None, description="sha256:<hex> the source's bytes must match")
    shards: dict[_Name, ShardSpec] | None = Field(
        default=None,
        max_length=MAX_SHARDS,
        description="Each region's own shard; a resident one is read only in its region.",
    )

    @field_validator("source")
    @classmethod
    def _source(cls, value: str | None) -> str | None:
        if value is not None:
            parse_uri(value, "source")
        return value

    @field_validator("sha256")
    @classmethod
    def _digest(cls, value: str | None) -> str | None:
        return value if value is None else check_digest(value, "sha256")

    @model_validator(mode="after")
    def _one_location(self) -> DataSpec:
        given = [name for name in ("path", "source", "shards") if getattr(self, name)]
        if len(given) > 1:
            raise ValueError(f"give one of data.path, data.source and data.shards, not {' and '.join(given)}")
        if self.shards is not None and not self.shards:
            raise ValueError("data.shards: at least one region")
        if self.shards and self.region:
            raise ValueError("data.region does not apply with data.shards (each shard names its region)")
        if self.sha256 and not self.source:
            raise ValueError("data.sha256 applies only with data.source")
        if self.kind == "tokens" and not given:
            raise ValueError("data.kind 'tokens' needs data.path, data.source or data.shards")
        return self

    @property
    def location(self) -> str | None:
        """Which of path, source and shards the data is given by (None: generated)."""
        return next((name for name in ("path", "source", "shards") if getattr(self, name)), None)

    @property
    def resident_regions(self) -> tuple[str, ...]:
        """Regions holding a shard that must stay there (each needs at least one replica)."""
        return tuple(sorted(r for r, s in (self.shards or {}).items() if s.resident))


class TrainingSpec(_Strict):
    steps: int = Field(gt=0, le=100_000_000)
    global_batch_tokens: int = Field(gt=0, le=1 << 40)
    micro_batch_size: int = Field(default=1, gt=0, le=65_536, description="Sequences per micro-batch.")
    lr: float = Field(default=3e-4, gt=0, le=10)
    warmup_steps: int = Field(default=0, ge=0)
    weight_decay: float = Field(default=0.1, ge=0, le=10)
    grad_clip: float = Field(default=1.0, ge=0, le=1e6)
    seed: int = Field(default=0, ge=0, le=SEED_MAX)
    precision: Literal["auto", "bf16", "fp32"] = Field(
        default="auto",
        description=(
            "bf16: autocast matmuls in bfloat16; weights, gradients and optimizer state stay fp32."
            " auto: bf16 when every device of the placement is CUDA, fp32 otherwise (each option"
            " of a quote states the precision it resolved to)."
        ),
    )
    activation_checkpointing: bool = Field(
        default=False, description="Recompute each block's activations in backward instead of keeping them."
    )
    checkpoint_every: int | None = Field(
        default=None,
        gt=0,
        le=100_000_000,
        description=(
            "Steps between checkpoints. None: the planner picks the interval that keeps checkpoint"
            " writes to at most 2 % of the run (each option of a quote states it)."
        ),
    )

    @model_validator(mode="after")
    def _warmup_within_steps(self) -> TrainingSpec:
        if self.warmup_steps > self.steps:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) exceeds steps ({self.steps})")
        return self


class ParallelismSpec(_Strict):
    """Pinned degrees; None leaves the choice to the planner."""

    dp: int | None = Field(default=None, gt=0, le=1 << 20)
    tp: int | None = Field(default=None, gt=0, le=1024)
    pp: int | None = Field(default=None, gt=0, le=1024)
    zero: Literal[0, 1, 2, 3] | None = None
    pp_schedule: Literal["1f1b", "gpipe"] = "1f1b"


_AUTO = ParallelismSpec()  # frozen, so shared: ``pinned`` is read thousands of times per quote

SyncMode = Literal["sync", "ssp", "local_sgd", "diloco", "async", "gossip"]
Compression = Literal["none", "fp16", "bf16", "int8", "topk"]
AUTO = "auto"
EVERY_MAX = 1_000_000


class SyncSpec(_Strict):
    """How replicas in different clusters (regions) keep their weights together.

    ``every`` and ``compression`` default to "auto": the planner picks them per option from its
    cost model and the links it sees (``control_layer.planner.sync_choice``; each option of a
    quote states what it chose). An explicit value is used as given.
    """

    mode: SyncMode = "diloco"
    every: int | Literal["auto"] = Field(
        default=AUTO,
        description=f"H: inner steps between outer syncs, 1 to {EVERY_MAX}; 'auto': the planner's choice.",
    )
    compression: Literal[Compression, "auto"] = Field(
        default=AUTO, description="Codec of the exchanged payload; 'auto': the planner's choice."
    )
    topk_ratio: float = Field(default=0.01, gt=0, le=1)
    staleness: int = Field(default=2, ge=0, le=10_000)
    outer_lr: float = Field(default=0.7, gt=0, le=10)
    outer_momentum: float = Field(default=0.9, ge=0, lt=1)
    gossip_peers: int = Field(default=2, ge=1, le=256)
    calibration: SyncCalibration | None = Field(
        default=None,
        description="Measured on this job's model and data by `cpn calibrate`: held-out loss of "
        "codec/overlap settings against fp32 blocking. The planner chooses codec and overlap from "
        "it and the quote shows the measured penalty.",
    )

    @field_validator("every", mode="before")
    @classmethod
    def _every_in_range(cls, value: Any) -> Any:
        # One message for the two forms (pydantic would report each member of the union apart).
        if value == AUTO:
            return value
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)  # as pydantic's lax int took it before "auto" existed
        elif isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= EVERY_MAX:
            raise ValueError(f"must be an integer from 1 to {EVERY_MAX} or 'auto', got {value!r}")
        return value

    @property
    def chosen_by_planner(self) -> tuple[str, ...]:
        """The settings left to the planner ("every", "compression")."""
        return tuple(f for f in ("every", "compression") if getattr(self, f) == AUTO)

    def with_choices(self, every: int | None = None, compression: str | None = None) -> SyncSpec:
        """This spec with the planner's choices in place of "auto" (explicit values stay)."""
        update: dict[str, Any] = {}
        if self.every == AUTO and every is not None:
            update["every"] = every
        if self.compression == AUTO and compression is not None:
            update["compression"] = compression
        return self.model_copy(update=update) if update else self


class QoSSpec(_Strict):
    max_hours: float | None = Field(default=None, gt=0, le=100_000)
    max_cost: float | None = Field(default=None, gt=0, le=1e12)
    regions: list[_Name] | None = Field(
        default=None, max_length=1000, description="Allowed regions; None means any."
    )
    exclude_regions: list[_Name] = Field(default_factory=list, max_length=1000)
    data_residency: str | None = Field(
        default=None,
        max_length=16,
        description="Jurisdiction code (e.g. 'EU'); every task runs in regions of it.",
    )
    accelerators: list[Annotated[str, Field(min_length=1, max_length=128)]] | None = Field(
        max_length=100,
        default=None,
        description="Allowed device models, matched case-insensitively as substrings.",
    )
    min_gpu_mem_gb: float | None = Field(default=None, gt=0, le=100_000)
    preemptible: bool = Field(
        default=False,
        description="Spot (preemptible) capacity allowed; the job may also be preempted by queued "
        "jobs of strictly higher priority (checkpointed and requeued).",
    )
    priority: int = Field(
        default=0,
        ge=-1000,
        le=1000,
        description="Admission priority: higher is admitted first (then fair share, then submission time).",
    )
    objective: Literal["cost", "time"] = "cost"


class CodeSpec(_Strict):
    """The user's code: a tar.gz archive in the artifact store (``cpn jobs submit --code DIR``
    packs and uploads it). Its root is put on ``sys.path``; ``entrypoint`` names a function in it."""

    digest: str = Field(description="sha256:<hex> of the uploaded archive")
    requirements_digest: str | None = Field(
        default=None, description="sha256:<hex> of the archive's requirements.txt; None: no requirements"
    )

    @field_validator("digest", "requirements_digest")
    @classmethod
    def _digests(cls, value: str | None, info: Any) -> str | None:
        return value if value is None else check_digest(value, info.field_name)


class OutputsSpec(_Strict):
    """Where the final model (safetensors + its config) goes, and whether the last checkpoint
    goes with it. None: the artifact store, listed by ``GET /v1/jobs/{id}/artifacts``."""

    uri: str | None = Field(
        default=None, max_length=MAX_URI, description="s3://bucket/prefix; None: the artifact store"
    )
    checkpoint: bool = Field(default=False, description="also upload the last checkpoint")

    @field_validator("uri")
    @classmethod
    def _uri(cls, value: str | None) -> str | None:
        if value is not None and parse_uri(value, "outputs.uri").scheme != "s3":
            raise ValueError("outputs.uri: only s3://bucket/prefix (None: the artifact store)")
        return value


_NAME_PATTERN = r"^[a-z0-9._-]{1,64}$"
_ENTRYPOINT_PATTERN = r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$"


class JobSpec(_Strict):
    name: str = Field(pattern=_NAME_PATTERN)
    model: ModelSpec
    data: DataSpec = Field(default_factory=DataSpec)
    training: TrainingSpec
    parallelism: Literal["auto"] | ParallelismSpec = "auto"
    sync: SyncSpec = Field(default_factory=SyncSpec)
    qos: QoSSpec = Field(default_factory=QoSSpec)
    entrypoint: str | None = Field(
        default=None,
        pattern=_ENTRYPOINT_PATTERN,
        description="Bring-your-own training function as 'package.module:function'.",
    )
    code: CodeSpec | None = Field(default=None, description="The user's code archive (needs an entrypoint)")
    outputs: OutputsSpec = Field(default_factory=OutputsSpec)
    entrypoint_parallelism: list[str] | None = Field(
        default=None,
        description=(
            "What the entrypoint's model supports: 'dp' (replicas, DDP) and 'zero' (FSDP2 sharding,"
            " ZeRO 1-3). Default ['dp']. Tensor and pipeline parallelism need the built-in GPT."
        ),
    )

    @model_validator(mode="after")
    def _batch_is_whole_sequences(self) -> JobSpec:
        if self.training.global_batch_tokens % self.model.seq_len:
            raise ValueError(
                f"training.global_batch_tokens ({self.training.global_batch_tokens}) must be a "
                f"multiple of model.seq_len ({self.model.seq_len})"
            )
        return self

    @model_validator(mode="after")
    def _code_and_data(self) -> JobSpec:
        if self.code is not None and self.entrypoint is None:
            raise ValueError("code needs an entrypoint ('module:function' inside the archive)")
        if self.entrypoint is None and self.data.kind == "synthetic-markov" and self.data.location:
            raise ValueError(
                f"data.{self.data.location} needs data.kind 'tokens' (or an entrypoint reading it)"
            )
        return self

    @model_validator(mode="after")
    def _entrypoint_parallelism(self) -> JobSpec:
        if self.entrypoint is None:
            if self.entrypoint_parallelism is not None:
                raise ValueError("entrypoint_parallelism applies only with an entrypoint")
            return self
        problems = byo_parallelism_problems(self.byo_parallelism)
        pins = self.pinned
        problems += byo_problems(
            entrypoint=True,
            supports=self.byo_parallelism,
            tp=pins.tp or 1,
            pp=pins.pp or 1,
            zero=pins.zero or 0,
            activation_checkpointing=self.training.activation_checkpointing,
        )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def byo_parallelism(self) -> tuple[str, ...]:
        """What the entrypoint's model supports (meaningful only with an entrypoint)."""
        if self.entrypoint_parallelism is None:
            return BYO_DEFAULT_PARALLELISM
        return tuple(self.entrypoint_parallelism)

    @property
    def global_batch_sequences(self) -> int:
        return self.training.global_batch_tokens // self.model.seq_len

    @property
    def pinned(self) -> ParallelismSpec:
        """The pinned degrees (all None when parallelism is 'auto')."""
        return self.parallelism if isinstance(self.parallelism, ParallelismSpec) else _AUTO

    @property
    def pp_schedule(self) -> str:
        return self.pinned.pp_schedule

    @classmethod
    def from_yaml_or_json(cls, text: str) -> JobSpec:
        """Parse a YAML or JSON document; raise InvalidArgument naming each bad field."""
        try:
            data: Any = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            try:
                data = json.loads(text)
            except json.JSONDecodeError:
                raise InvalidArgument(f"job spec is neither YAML nor JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise InvalidArgument("job spec must be a mapping at the top level")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise invalid_argument_from(exc, "job spec") from exc


def is_union_tag(part: object) -> bool:
    # pydantic names the union member it tried ("literal['auto']", "ParallelismSpec"); fields are lower-case
    return isinstance(part, str) and (part[:1].isupper() or "[" in part or "'" in part)


def invalid_argument_from(exc: ValidationError, what: str) -> InvalidArgument:
    """Turn a pydantic error into the domain error, one 'field.path: message' per problem.

    For a union field (``parallelism: "auto" | {...}``) only the member the input was meant for
    is reported: a mapping is not a failed attempt at the literal.
    """
    raw = exc.errors()
    locs = [tuple(err["loc"]) for err in raw]
    errors = []
    for err, loc in zip(raw, locs, strict=True):
        tag_at = next((i for i, part in enumerate(loc) if is_union_tag(part)), None)
        if (
            tag_at is not None
            and str(loc[tag_at]).startswith("literal[")
            and any(
                other[:tag_at] == loc[:tag_at] and len(other) > tag_at and other[tag_at] != loc[tag_at]
                for other in locs
            )
        ):
            continue  # the input was a mapping: the literal member was never the intent
        field = ".".join(str(p) for p in loc if not is_union_tag(p)) or "(root)"
        errors.append({"field": field, "message": err["msg"]})
    lines = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
    return InvalidArgument(f"invalid {what}: {lines}", errors=errors)
