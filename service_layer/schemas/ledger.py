"""The ledger's transactions, invoices and payout statements. Money is a decimal string with six
places (the ledger keeps integer micro-units); quantities are floats."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from pydantic import BaseModel, Field

MONTH_PATTERN = r"^\d{4}-(0[1-9]|1[0-2])$"


class PostingRead(BaseModel):
    account: str = Field(description="tenant:<id>, provider:<name>, platform:fees or platform:egress")
    amount: Decimal = Field(description="Positive: a debit; negative: a credit")


class TransactionRead(BaseModel):
    id: int
    kind: str = Field(description="gpu (device time) or egress (WAN bytes)")
    job_id: str
    task_id: str | None
    tenant_id: str
    provider: str
    region: str
    attempt: int
    quantity: float
    unit: str = Field(description="device-hour or GB")
    unit_price: float
    amount: Decimal = Field(description="What the tenant is charged")
    fee_rate: float = Field(description="The platform's share of a device-time charge")
    period_start: datetime
    period_end: datetime
    created_at: datetime
    postings: list[PostingRead] = Field(description="They sum to exactly zero")


class TransactionPage(BaseModel):
    transactions: list[TransactionRead]
    next_cursor: int | None = Field(description="Pass as ?after= for the next page; null at the end")


class DocumentLine(BaseModel):
    job_id: str
    job_name: str
    kind: str
    region: str
    provider: str
    quantity: float
    unit: str
    unit_price: float
    amount: Decimal = Field(description="Charged to the tenant")
    transactions: int


class StatementLine(DocumentLine):
    fee: Decimal = Field(description="What the platform kept of the charge")
    payout: Decimal = Field(description="What the provider is paid")


class InvoiceRead(BaseModel):
    tenant_id: str
    tenant_name: str
    account: str
    month: str
    period_start: datetime
    period_end: datetime
    lines: list[DocumentLine]
    total: Decimal


class StatementRead(BaseModel):
    provider: str
    account: str
    month: str
    period_start: datetime
    period_end: datetime
    lines: list[StatementLine]
    gross: Decimal = Field(description="Tenants' device-time charges on the provider's clusters")
    fees: Decimal
    payout: Decimal = Field(description="gross - fees: what the provider is paid")
