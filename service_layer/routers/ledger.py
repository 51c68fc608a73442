"""The ledger: transactions, a tenant's monthly invoice, a provider's monthly payout statement."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query
from sqlalchemy import select

from contracts.errors import InvalidArgument, NotFound, PermissionDenied
from orchestration.db.engine import as_utc
from orchestration.db.models import Provider, Tenant
from orchestration.ledger import list_transactions
from orchestration.ledger.postings import UNITS, micros_to_decimal, month_bounds
from orchestration.ledger.statements import Document, Line, invoice, statement
from service_layer.deps import AdminTenant, CurrentTenant, SessionDep
from service_layer.schemas.common import ROW_ID_MAX, error_responses
from service_layer.schemas.ledger import (
    MONTH_PATTERN,
    DocumentLine,
    InvoiceRead,
    PostingRead,
    StatementLine,
    StatementRead,
    TransactionPage,
    TransactionRead,
)

router = APIRouter(tags=["ledger"], responses=error_responses(401, 422))

MonthQuery = Annotated[str, Query(pattern=MONTH_PATTERN, description="YYYY-MM (UTC)", examples=["2026-11"])]


def _month(month: str) -> tuple[datetime, datetime]:
    try:
        return month_bounds(month)
    except ValueError as exc:
        raise InvalidArgument(str(exc), field="month") from None


@router.get("/ledger/transactions", response_model=TransactionPage, summary="Ledger transactions")
def transactions(
    session: SessionDep,
    tenant: CurrentTenant,
    job_id: Annotated[str | None, Query(max_length=32)] = None,
    account: Annotated[
        str | None, Query(max_length=200, description="Only transactions posting to it, e.g. provider:lumen")
    ] = None,
    after: Annotated[
        int, Query(ge=0, le=ROW_ID_MAX, description="Only transactions with a larger id (a cursor)")
    ] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> TransactionPage:
    """Charges oldest first, each with its postings. An admin sees every transaction; a tenant
    only its own charges."""
    txs, postings = list_transactions(
        session,
        tenant_id=None if tenant.is_admin else tenant.id,
        job_id=job_id,
        account=account,
        after=after,
        limit=limit,
    )
    page = [
        TransactionRead(
            id=tx.id,
            kind=tx.kind,
            job_id=tx.job_id,
            task_id=tx.task_id,
            tenant_id=tx.tenant_id,
            provider=tx.provider,
            region=tx.region,
            attempt=tx.attempt,
            quantity=tx.quantity,
            unit=UNITS.get(tx.kind, ""),
            unit_price=tx.unit_price,
            amount=micros_to_decimal(tx.amount_micros),
            fee_rate=tx.fee_rate,
            period_start=as_utc(tx.period_start),
            period_end=as_utc(tx.period_end),
            created_at=as_utc(tx.created_at),
            postings=[PostingRead(account=a, amount=micros_to_decimal(m)) for a, m in postings[tx.id]],
        )
        for tx in txs
    ]
    return TransactionPage(transactions=page, next_cursor=txs[-1].id if len(txs) == limit else None)


def _line(line: Line, cls: type[DocumentLine]) -> DocumentLine:
    extra = {}
    if cls is StatementLine:
        extra = {
            "fee": micros_to_decimal(line.amount_micros - line.payout_micros),
            "payout": micros_to_decimal(line.payout_micros),
        }
    return cls(
        job_id=line.job_id,
        job_name=line.job_name,
        kind=line.kind,
        region=line.region,
        provider=line.provider,
        quantity=line.quantity,
        unit=UNITS.get(line.kind, ""),
        unit_price=line.unit_price,
        amount=micros_to_decimal(line.amount_micros),
        transactions=line.transactions,
        **extra,
    )


@router.get(
    "/tenants/{tenant_id}/invoice",
    response_model=InvoiceRead,
    summary="A tenant's monthly invoice",
    responses=error_responses(403, 404),
)
def tenant_invoice(
    session: SessionDep, caller: CurrentTenant, tenant_id: str, month: MonthQuery
) -> InvoiceRead:
    """What the tenant was charged in the month: a line per job, kind, region and unit price (admin,
    or the tenant itself)."""
    if not caller.is_admin and caller.id != tenant_id:
        raise PermissionDenied("a tenant reads only its own invoice", field="tenant_id")
    start, end = _month(month)
    tenant = session.get(Tenant, tenant_id)
    if tenant is None:
        raise NotFound(f"no tenant {tenant_id}", field="tenant_id")
    doc: Document = invoice(session, tenant_id, start, end)
    return InvoiceRead(
        tenant_id=tenant.id,
        tenant_name=tenant.name,
        account=doc.account,
        month=month,
        period_start=start,
        period_end=end,
        lines=[_line(line, DocumentLine) for line in doc.lines],
        total=micros_to_decimal(doc.total_micros),
    )


@router.get(
    "/providers/{name}/statement",
    response_model=StatementRead,
    summary="A provider's monthly payout statement",
    responses=error_responses(403, 404),
)
def provider_statement(session: SessionDep, _: AdminTenant, name: str, month: MonthQuery) -> StatementRead:
    """Tenants' device-time charges on the provider's clusters in the month, the platform's fee,
    and the payout (admin)."""
    start, end = _month(month)
    if session.scalar(select(Provider.id).where(Provider.name == name)) is None:
        raise NotFound(f"no provider {name!r}", field="name")
    doc = statement(session, name, start, end)
    return StatementRead(
        provider=name,
        account=doc.account,
        month=month,
        period_start=start,
        period_end=end,
        lines=[_line(line, StatementLine) for line in doc.lines],
        gross=micros_to_decimal(doc.gross_micros),
        fees=micros_to_decimal(doc.fees_micros),
        payout=micros_to_decimal(doc.total_micros),
    )
