"""Admission policy: the order queued jobs are tried in, what holds one back, and the quota rules.

Pure functions over plain data; the placer (``control_layer.placer``) reads the rows, calls these,
and writes what they decide. The model is Kueue's:

- **Order.** Higher ``qos.priority`` first; between tenants of equal priority, fair share by device
  count (the tenant holding fewer devices right now goes first: dominant-resource fairness with
  the device as the one resource, every tenant weighing the same); then submission time, then id.
  The placer re-orders after every admission, so a tenant that just got devices falls behind the
  others of its priority.
- **Head of line.** ``best_effort_fifo`` (the default, Kueue's BestEffortFIFO): a job that does not
  fit now is passed over and the jobs behind it are tried, so a large job never blocks smaller
  ones; it keeps its place and is admitted as soon as it fits (or takes devices from lower
  priorities by preemption). ``strict_fifo`` (Kueue's StrictFIFO): the first job in order that
  waits for devices blocks every job behind it, so nothing can overtake it. In both, a job held
  back by its own tenant's quota blocks nobody else.
- **Quotas.** ``max_devices``: a job whose devices would take its tenant over waits in the queue.
  ``max_monthly_spend``: a submission whose estimate would take the month's spend over is refused
  (402).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from contracts.errors import PaymentRequired


class QueueStrategy(StrEnum):
    BEST_EFFORT_FIFO = "best_effort_fifo"
    STRICT_FIFO = "strict_fifo"


@dataclass(frozen=True)
class QueueEntry:
    job_id: str
    tenant_id: str
    priority: int
    submitted_at: datetime


def order_key(entry: QueueEntry, devices_in_use: Mapping[str, int]) -> tuple[int, int, datetime, str]:
    return (-entry.priority, devices_in_use.get(entry.tenant_id, 0), entry.submitted_at, entry.job_id)


def admission_order(entries: Iterable[QueueEntry], devices_in_use: Mapping[str, int]) -> list[QueueEntry]:
    """Entries in the order the placer tries them: priority, fair share, submission time, id."""
    return sorted(entries, key=lambda e: order_key(e, devices_in_use))


def blocks_rest(strategy: QueueStrategy, waiting_for_devices: bool) -> bool:
    """Whether a job that was not admitted holds back every job after it in this pass."""
    return strategy is QueueStrategy.STRICT_FIFO and waiting_for_devices


def device_quota_wait(in_use: int, requested: int, max_devices: int | None) -> str | None:
    """Why a job must wait for its tenant's device quota, or None when it may be admitted."""
    if max_devices is None or in_use + requested <= max_devices:
        return None
    return (
        f"tenant device quota: {in_use} in use + {requested} requested > max_devices {max_devices}; "
        "waits until the tenant's other jobs release devices"
    )


def spend_refusal(
    estimate: float, month_spend: float, cap: float | None, month: str
) -> PaymentRequired | None:
    """The 402 for a submission that would take its tenant's spend in ``month`` over the cap."""
    if cap is None or month_spend + estimate <= cap:
        return None
    return PaymentRequired(
        f"monthly spend cap exceeded: {month_spend:.6g} spent in {month} + {estimate:.6g} estimated "
        f"> max_monthly_spend {cap:.6g}",
        field="max_monthly_spend",
        month=month,
        month_spend=month_spend,
        estimate=estimate,
        max_monthly_spend=cap,
    )


def positions(order: Iterable[QueueEntry]) -> dict[str, int]:
    """1-based queue positions in admission order."""
    return {e.job_id: i for i, e in enumerate(order, start=1)}
