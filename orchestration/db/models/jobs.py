"""Control-layer tables: quotes, jobs, their per-node tasks, and device allocations."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, ForeignKey, Index, String, false, text
from sqlalchemy.orm import Mapped, mapped_column

from contracts.states import JobState, TaskState
from orchestration.db.base import Base, new_id, utcnow
from orchestration.settings import DEFAULT_PLATFORM_FEE


class Quote(Base):
    __tablename__ = "quotes"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    spec: Mapped[dict[str, Any]]
    options: Mapped[list[Any]]  # PlanOption JSON, ranked
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime]


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    spec: Mapped[dict[str, Any]]
    # queued | placed | running | succeeded | failed | cancelled
    status: Mapped[str] = mapped_column(String(16), default=JobState.QUEUED, index=True)
    # Admission priority (the spec's qos.priority, kept as a column so the queue orders in SQL).
    priority: Mapped[int] = mapped_column(default=0, server_default=text("0"))
    option: Mapped[dict[str, Any] | None] = mapped_column(default=None)  # accepted PlanOption JSON
    choice: Mapped[str] = mapped_column(String(16), default="cheapest")  # how the option was chosen
    quote_id: Mapped[str | None] = mapped_column(ForeignKey("quotes.id"), default=None)
    attempt: Mapped[int] = mapped_column(default=0)
    reason: Mapped[str] = mapped_column(String(2000), default="")
    # Why a queued job waits right now (devices busy, quota, jobs ahead, contention); None once
    # placed or ended.
    deferred: Mapped[str | None] = mapped_column(String(2000), default=None)
    # 1-based place in the admission order, as the placer's last pass (or the submission) saw it.
    queue_position: Mapped[int | None] = mapped_column(default=None)
    # The preemption its tasks are stopping on ({reason, by_job_id, requested_at, deadline_at});
    # None when none is under way (control_layer.preemption).
    preemption: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    # Times it went back to the queue preempted: those re-placements are not retries.
    preemptions: Mapped[int] = mapped_column(default=0, server_default="0")
    estimated_duration_s: Mapped[float | None] = mapped_column(default=None)
    estimated_cost: Mapped[float | None] = mapped_column(default=None)
    actual_cost: Mapped[float | None] = mapped_column(default=None)
    result: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    # Estimate next to actual for time and cost, with breakdowns; written when the job ends.
    accuracy: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)


class Task(Base):
    """One node's share of a job attempt: the unit an agent launches with torchrun."""

    __tablename__ = "tasks"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    attempt: Mapped[int]
    cluster_id: Mapped[str] = mapped_column(ForeignKey("clusters.id"))
    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.id"), index=True)
    region: Mapped[str] = mapped_column(String(64))
    # pending | dispatched | starting | running | succeeded | failed | cancelled
    status: Mapped[str] = mapped_column(String(16), default=TaskState.PENDING, index=True)
    device_indices: Mapped[list[Any]]
    placement: Mapped[list[Any]]  # the plan's {dp_rank, pp_stage, tp_rank, ...} entries on this node
    worker_config: Mapped[dict[str, Any]]
    sync_port: Mapped[int | None] = mapped_column(default=None)
    # Prices in force when the task was placed: the ledger charges these, not later price changes.
    price_per_device_hour: Mapped[float] = mapped_column(default=0.0)
    egress_price_per_gb: Mapped[float] = mapped_column(default=0.0)
    # The platform's share of the task's device-time charges, also fixed at placement.
    platform_fee: Mapped[float] = mapped_column(default=DEFAULT_PLATFORM_FEE, server_default=text("0.1"))
    # Metering watermarks: device time is charged up to ``metered_until`` and egress up to
    # ``metered_egress_bytes`` of the leader's cumulative WAN bytes (orchestration.ledger.metering).
    metered_until: Mapped[datetime | None] = mapped_column(default=None)
    metered_egress_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    exit_code: Mapped[int | None] = mapped_column(default=None)
    message: Mapped[str] = mapped_column(String(2000), default="")
    last_metrics: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    result: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    # The step of the latest complete checkpoint in the task's directory on its node.
    checkpoint_step: Mapped[int | None] = mapped_column(default=None)
    # Lost from an elastic job: no longer one of its attempt's tasks (the others went on without it).
    dropped: Mapped[bool] = mapped_column(default=False, server_default=false())
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)


class Allocation(Base):
    """A device held by a task. The partial unique index makes double-booking impossible in the DB."""

    __tablename__ = "allocations"
    __table_args__ = (
        Index(
            "uq_allocations_active_accelerator",
            "accelerator_id",
            unique=True,
            sqlite_where=text("active"),
            postgresql_where=text("active"),
        ),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    task_id: Mapped[str] = mapped_column(ForeignKey("tasks.id"), index=True)
    # Indexed: a node's contention figure counts the host's slots held at its probes' instants.
    accelerator_id: Mapped[str] = mapped_column(ForeignKey("accelerators.id"), index=True)
    active: Mapped[bool] = mapped_column(default=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    released_at: Mapped[datetime | None] = mapped_column(default=None)


class TaskMetric(Base):
    """Per-step metrics reported by a task's leader worker (the loss curve)."""

    __tablename__ = "task_metrics"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    task_id: Mapped[str] = mapped_column(ForeignKey("tasks.id"))
    region: Mapped[str] = mapped_column(String(64))
    step: Mapped[int]
    loss: Mapped[float | None]  # None when the worker reported a non-finite loss
    tokens_per_s: Mapped[float] = mapped_column(default=0.0)
    compute_utilization: Mapped[float] = mapped_column(default=0.0)
    # Cumulative bytes this task's leader sent/received over the WAN since it started (can exceed 2^31).
    wan_bytes_sent: Mapped[int] = mapped_column(BigInteger, default=0)
    wan_bytes_recv: Mapped[int] = mapped_column(BigInteger, default=0)
    # The step's time by part (data_s, compute_s, optimizer_s, sync_s, checkpoint_s, wall_s), as reported.
    timings: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    # Gossip: the regions' spread at the latest check (None: not a gossip job, or no check yet).
    gossip_spread: Mapped[float | None] = mapped_column(default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class CheckpointCopy(Base):
    """A complete checkpoint of one of a job's participants, copied to another node of its region
    (ordered after the task completed it, or fetched before a re-placed task launched). An ``ok``
    row says ``node_id`` holds ``dir``/step under its work dir; pending rows are orders in flight."""

    __tablename__ = "checkpoint_copies"
    __table_args__ = (Index("ix_checkpoint_copies_job_participant", "job_id", "participant", "step"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)  # the transfer id
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"))
    participant: Mapped[str] = mapped_column(String(200))
    dir: Mapped[str] = mapped_column(String(400))
    step: Mapped[int]
    source_node_id: Mapped[str] = mapped_column(String(32))
    node_id: Mapped[str] = mapped_column(String(32), index=True)  # the node receiving the copy
    purpose: Mapped[str] = mapped_column(String(16), default="copy")  # copy | fetch (before a launch)
    status: Mapped[str] = mapped_column(String(16), default="pending")  # pending | ok | failed
    bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    duration_s: Mapped[float | None] = mapped_column(default=None)
    error: Mapped[str] = mapped_column(String(500), default="")
    requested_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
