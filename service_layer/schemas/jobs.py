"""Quotes, jobs, tasks, progress, metrics and events as the API shows them."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from contracts.job_spec import JobSpec
from control_layer.planner.plan_types import PlanOption

Choice = Literal["cheapest", "fastest", "balanced"]

EXAMPLE_SPEC: dict[str, Any] = {
    "name": "gpt-small",
    "model": {"family": "gpt", "n_layers": 4, "d_model": 256, "n_heads": 4, "vocab": 512, "seq_len": 256},
    "data": {"kind": "synthetic-markov", "seed": 0},
    "training": {"steps": 2000, "global_batch_tokens": 65536, "lr": 3e-4},
    "parallelism": "auto",
    "sync": {"mode": "diloco"},  # H and the codec: the planner's ("auto"), shown in each option
    "qos": {"max_hours": 48, "max_cost": 5000, "regions": ["eu-west", "eu-north"], "objective": "cost"},
}

QUOTE_EXAMPLES: dict[str, dict[str, Any]] = {
    "diloco-across-eu": {
        "summary": "Small GPT, DiLoCo across two EU regions",
        "value": EXAMPLE_SPEC,
    },
    "pinned-degrees": {
        "summary": "Pinned parallelism, sync interval, codec and data residency",
        "value": {
            **EXAMPLE_SPEC,
            "name": "gpt-pinned",
            "parallelism": {"dp": 4, "tp": 2, "pp": 1, "zero": 1},
            "sync": {"mode": "diloco", "every": 100, "compression": "int8"},
            "qos": {"max_hours": 12, "data_residency": "EU", "accelerators": ["H100", "A100"]},
        },
    },
}

JOB_EXAMPLES: dict[str, dict[str, Any]] = {
    "accept-quote": {
        "summary": "Accept one option of a quote",
        "value": {"quote_id": "3f0c6f1e9a2b4c8d9e0f1a2b3c4d5e6f", "option_id": "opt-1"},
    },
    "spec-and-choice": {
        "summary": "Quote and accept in one call, by label",
        "value": {"spec": EXAMPLE_SPEC, "choice": "fastest"},
    },
}


class QuoteRead(BaseModel):
    id: str
    created_at: datetime
    expires_at: datetime
    spec: dict[str, Any]
    options: list[PlanOption] = Field(description="Ranked, complete plans with time and cost estimates")


class JobCreate(BaseModel):
    """Either accept a quote's option, or give a spec and let the label choose."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [v["value"] for v in JOB_EXAMPLES.values()]}
    )

    quote_id: str | None = None
    option_id: str | None = None
    spec: JobSpec | None = None
    choice: Choice = "cheapest"

    @model_validator(mode="after")
    def _one_way(self) -> JobCreate:
        by_quote = self.quote_id is not None or self.option_id is not None
        if by_quote and self.spec is not None:
            raise ValueError("give either {quote_id, option_id} or {spec, choice}, not both")
        if by_quote and not (self.quote_id and self.option_id):
            raise ValueError("quote_id and option_id go together")
        if not by_quote and self.spec is None:
            raise ValueError("give either {quote_id, option_id} or {spec, choice}")
        return self


class CancelRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field("cancelled by user", max_length=500)


class PreemptRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=1, max_length=500, description="Recorded on the job and its events")
    by_job_id: str | None = Field(None, min_length=1, max_length=32, description="The job it makes room for")
    grace_s: float = Field(
        30.0,
        gt=0,
        le=600,
        allow_inf_nan=False,
        description="Seconds the workers get to checkpoint and stop before they are cancelled",
    )


class Progress(BaseModel):
    """Latest metrics of the current attempt: the slowest task's step, mean loss, summed throughput."""

    step: int
    total_steps: int
    loss: float | None
    tokens_per_s: float
    wan_bytes_sent: int = Field(
        0,
        description="gRPC message bytes of the sync service sent to peer regions (egress is priced on these)",
    )
    wan_bytes_recv: int = 0
    wan_wire_bytes_sent: int | None = Field(
        None,
        description="What the same connections put on the wire, from the kernel's TCP counters: payload, "
        "retransmissions and every segment's Ethernet/IP/TCP headers, ACKs included; null unless every "
        "reporting task could read them",
    )


class EstimatesRead(BaseModel):
    duration_s: float | None
    cost_total: float | None
    step_s: dict[str, float] = Field(default_factory=dict)
    cost: dict[str, float] = Field(default_factory=dict)
    tokens_per_s: float | None = None
    interval: dict[str, Any] | None = Field(None, description="Where the actual should land (p10..p90)")


class TaskRead(BaseModel):
    id: str
    attempt: int
    region: str
    cluster_id: str
    cluster_name: str
    node_id: str
    device_indices: list[int]
    status: str
    exit_code: int | None
    message: str
    placement: list[dict[str, Any]]
    last_metrics: dict[str, Any] | None
    checkpoint_step: int | None = Field(None, description="Latest complete checkpoint on its node")


class JobSummary(BaseModel):
    id: str
    name: str
    tenant_id: str
    status: str
    reason: str
    deferred: str | None = Field(None, description="Why placement is put off right now (devices contended)")
    choice: str
    attempt: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    regions: list[str]
    estimated_duration_s: float | None
    estimated_cost: float | None
    actual_cost: float | None
    progress: Progress | None


class QueueInfo(BaseModel):
    position: int | None = Field(description="1-based place in the admission order (all tenants)")
    reason: str | None = Field(description="Why the job waits right now")


class QueueEntryRead(BaseModel):
    job_id: str
    name: str
    tenant_id: str
    priority: int
    position: int | None
    reason: str | None
    submitted_at: datetime
    attempt: int


class JobDetail(JobSummary):
    queue: QueueInfo | None = Field(
        None, description="While the job is queued: its position and why it waits"
    )
    quote_id: str | None
    spec: dict[str, Any]
    option: dict[str, Any] | None = Field(description="The accepted PlanOption")
    tasks: list[TaskRead] = Field(description="Tasks of the current attempt: the placement")
    checkpoints: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Latest complete checkpoint per sync participant over all attempts: step, node, task",
    )
    estimates: EstimatesRead | None
    actual_duration_s: float | None
    result: dict[str, Any] | None
    entropy_floor: float | None = Field(description="Loss floor of the synthetic data (nats/token), if known")
    accuracy: dict[str, Any] | None = Field(
        None, description="Estimate next to actual for time and cost, with breakdowns; set when the job ends"
    )
    preemption: dict[str, Any] | None = Field(
        None,
        description="The preemption its tasks are stopping on (reason, by_job_id, grace_s, requested_at, "
        "deadline_at); null when none is under way",
    )
    preemptions: int = Field(0, description="Times it went back to the queue preempted (no retry spent)")


class MetricPoint(BaseModel):
    step: int
    loss: float | None
    tokens_per_s: float
    task_id: str


class SpreadPoint(BaseModel):
    step: int
    spread: float


class MetricSeries(BaseModel):
    job_id: str
    entropy_floor: float | None
    uniform_loss: float | None
    series: dict[str, list[MetricPoint]] = Field(description="Per region, in step order")
    spread: dict[str, list[SpreadPoint]] = Field(
        default_factory=dict,
        description="Gossip jobs: per region, the regions' spread (largest distance of a region's "
        "parameters from their mean) at each check, in step order",
    )


class EventRead(BaseModel):
    id: int
    kind: str
    job_id: str | None
    payload: dict[str, Any]
    created_at: datetime
