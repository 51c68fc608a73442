"""The ledger's pure core: what one meter of a task charges, and how a charge is posted.

Amounts are integer micro-units. A task's device-time charge up to time t is
``round(price x devices x (t - started) in hours)``, and each meter charges the difference between
that at the new watermark and at the old one: the sum over any sequence of meters telescopes to
the one rounding of the whole run, so how often a task was metered never changes what it costs.
Egress works the same on the leader's cumulative bytes. Periods are cut at UTC month starts, so
each transaction belongs to one month's invoice and statement.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal

MICROS = 1_000_000
BYTES_PER_GB = 1_000_000_000
FEES = "platform:fees"
EGRESS = "platform:egress"
GPU, EGRESS_KIND = "gpu", "egress"
UNITS = {GPU: "device-hour", EGRESS_KIND: "GB"}
_MONTH = re.compile(r"^(\d{4})-(0[1-9]|1[0-2])$")
_ONE_US = timedelta(microseconds=1)


def tenant_account(tenant_id: str) -> str:
    return f"tenant:{tenant_id}"


def provider_account(name: str) -> str:
    return f"provider:{name}"


def account_kind(name: str) -> str:
    return name.split(":", 1)[0]


def _round(x: Decimal) -> int:
    return int(x.to_integral_value(rounding=ROUND_HALF_EVEN))


def _dec(x: float) -> Decimal:
    return Decimal(repr(float(x)))  # the float as written, not its binary expansion


def micros_to_decimal(micros: int) -> Decimal:
    return (Decimal(micros) / MICROS).quantize(Decimal("0.000001"))


def device_micros(price_per_device_hour: float, devices: int, elapsed: timedelta) -> int:
    """What ``devices`` cost over ``elapsed`` at the price, in micro-units (elapsed in whole µs)."""
    us = max(0, elapsed // _ONE_US)
    return _round(_dec(price_per_device_hour) * devices * us / 3600)


def egress_micros(price_per_gb: float, nbytes: int) -> int:
    return _round(_dec(price_per_gb) * max(0, nbytes) / 1000)


def split_fee(amount_micros: int, fee_rate: float) -> tuple[int, int]:
    """(provider's share, platform's fee) of a device-time charge; they add up to the charge."""
    fee = _round(Decimal(amount_micros) * _dec(fee_rate))
    return amount_micros - fee, fee


def charge_postings(
    kind: str, amount_micros: int, fee_rate: float, *, tenant: str, provider: str
) -> list[tuple[str, int]]:
    """The postings of one charge, summing to zero: device time debits the tenant, credits the
    provider the charge less the fee and the platform the fee; egress debits the tenant and credits
    the platform (egress is bought from the network between regions, not from the provider)."""
    if kind == GPU:
        payout, fee = split_fee(amount_micros, fee_rate)
        return [(tenant, amount_micros), (provider, -payout), (FEES, -fee)]
    if kind == EGRESS_KIND:
        return [(tenant, amount_micros), (EGRESS, -amount_micros)]
    raise ValueError(f"unknown charge kind {kind!r}")


def month_start(t: datetime) -> datetime:
    return datetime(t.year, t.month, 1, tzinfo=UTC)


def next_month(t: datetime) -> datetime:
    return datetime(t.year + (t.month == 12), t.month % 12 + 1, 1, tzinfo=UTC)


def month_bounds(month: str) -> tuple[datetime, datetime]:
    """``YYYY-MM`` to [first instant, first instant of the next month); ValueError otherwise."""
    m = _MONTH.match(month)
    if m is None or int(m.group(1)) < 1970:
        raise ValueError(f"month must be YYYY-MM (1970 or later), got {month!r}")
    start = datetime(int(m.group(1)), int(m.group(2)), 1, tzinfo=UTC)
    return start, next_month(start)


def month_segments(start: datetime, end: datetime) -> list[tuple[datetime, datetime]]:
    """[start, end) cut at each UTC month start it crosses."""
    out = []
    while start < end:
        cut = min(end, next_month(start))
        out.append((start, cut))
        start = cut
    return out


@dataclass(frozen=True)
class Charge:
    kind: str
    period_start: datetime
    period_end: datetime
    quantity: float  # device-hours or GB
    unit_price: float
    amount_micros: int
    # Where the charge starts on the task's meter: µs since the epoch for device time, bytes
    # already billed for egress. Each meter starts where the last one ended, so (task, kind,
    # meter_from) names a charge once.
    meter_from: int


@dataclass(frozen=True)
class TaskMeter:
    """What a meter needs of a task (all times UTC)."""

    started_at: datetime | None
    finished_at: datetime | None
    metered_until: datetime | None
    devices: int
    price_per_device_hour: float
    egress_price_per_gb: float
    metered_egress_bytes: int
    reported_egress_bytes: int


@dataclass(frozen=True)
class Metered:
    charges: list[Charge]
    metered_until: datetime | None
    metered_egress_bytes: int


def epoch_us(t: datetime) -> int:
    return (t - datetime(1970, 1, 1, tzinfo=UTC)) // _ONE_US


def meter(task: TaskMeter, now: datetime) -> Metered:
    """Charges from the task's watermarks up to ``now`` (or its end, if it has ended), and the new
    watermarks. Metering again up to the same time charges nothing."""
    charges: list[Charge] = []
    until = task.metered_until
    if task.started_at is not None:
        start, price, n = task.started_at, task.price_per_device_hour, task.devices
        end = task.finished_at if task.finished_at is not None else now
        frm = task.metered_until or start
        for a, b in month_segments(frm, end):
            amount = device_micros(price, n, b - start) - device_micros(price, n, a - start)
            hours = n * ((b - a) // _ONE_US) / 3.6e9
            charges.append(Charge(GPU, a, b, hours, price, amount, epoch_us(a)))
        if end > frm:
            until = end
    billed, sent = task.metered_egress_bytes, task.reported_egress_bytes
    if sent > billed:
        # Billed with the meter's last period (bytes carry no time of their own), or at ``now``.
        a, b = (charges[-1].period_start, charges[-1].period_end) if charges else (now, now)
        price = task.egress_price_per_gb
        amount = egress_micros(price, sent) - egress_micros(price, billed)
        charges.append(Charge(EGRESS_KIND, a, b, (sent - billed) / BYTES_PER_GB, price, amount, billed))
        billed = sent
    return Metered(charges, until, billed)
