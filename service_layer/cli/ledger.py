"""Ledger commands: transactions, a tenant's invoice, a provider's payout statement."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.table import Table

from service_layer.cli.common import DEFAULT_SERVER, ApiKeyOpt, JsonOpt, ServerOpt, api, console, print_json
from service_layer.client import CpnClient

ledger_app = typer.Typer(help="The double-entry ledger.", no_args_is_help=True)

MonthOpt = Annotated[
    str,
    typer.Option("--month", help="YYYY-MM (UTC); default: this month", show_default=False),
]


def _this_month() -> str:
    return datetime.now(UTC).strftime("%Y-%m")


@ledger_app.command("transactions")
def transactions(
    job_id: Annotated[str | None, typer.Option("--job", help="Only this job's charges")] = None,
    account: Annotated[str | None, typer.Option(help="Only those posting to it, e.g. provider:lumen")] = None,
    after: Annotated[int, typer.Option(min=0, help="Cursor: only transactions with a larger id")] = 0,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 100,
    server: ServerOpt = DEFAULT_SERVER,
    api_key: ApiKeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Charges oldest first with their postings (admin: all; a tenant: its own)."""
    with api(server, api_key) as client:
        page = client.transactions(job_id=job_id, account=account, after=after, limit=limit)
    if as_json:
        print_json(page)
        return
    table = Table(title="ledger transactions")
    for col in (
        "id",
        "period start",
        "job",
        "kind",
        "region",
        "quantity",
        "unit price",
        "amount",
        "postings",
    ):
        table.add_column(col, no_wrap=col != "postings")
    for tx in page["transactions"]:
        table.add_row(
            str(tx["id"]),
            tx["period_start"][:19],
            tx["job_id"][:12],
            tx["kind"],
            tx["region"],
            f"{tx['quantity']:.6g} {tx['unit']}",
            f"{tx['unit_price']:g}",
            tx["amount"],
            "  ".join(f"{p['account']} {p['amount']}" for p in tx["postings"]),
        )
    console.print(table)
    if page["next_cursor"] is not None:
        console.print(f"more: --after {page['next_cursor']}")


@dataclass(frozen=True)
class _Monthly:
    """How a monthly ledger document prints: title and totals (``str.format`` over the document)
    and the line columns past the common ones."""

    title: str
    totals: str
    extra: tuple[str, ...] = ()


_INVOICE = _Monthly("invoice {month}: {tenant_name} ({account})", "total {total}")
_STATEMENT = _Monthly(
    "payout statement {month}: {account}", "gross {gross}  fees {fees}  payout {payout}", ("fee", "payout")
)


def _lines(title: str, lines: list[dict[str, Any]], extra: tuple[str, ...]) -> Table:
    table = Table(title=title)
    for col in ("job", "kind", "region", "provider", "quantity", "unit price", "amount", *extra):
        table.add_column(col)
    for line in lines:
        table.add_row(
            line["job_name"] or line["job_id"][:12],
            line["kind"],
            line["region"],
            line["provider"],
            f"{line['quantity']:.6g} {line['unit']}",
            f"{line['unit_price']:g}",
            line["amount"],
            *(line[col] for col in extra),
        )
    return table


def _show_month(
    fetch: Callable[[CpnClient, str], dict[str, Any]],
    layout: _Monthly,
    month: str,
    server: str,
    api_key: str | None,
    as_json: bool,
) -> None:
    """Fetch a monthly document (this month's when ``month`` is empty) and print it: as JSON, or
    as its lines and totals."""
    with api(server, api_key) as client:
        doc = fetch(client, month or _this_month())
    if as_json:
        print_json(doc)
        return
    console.print(_lines(layout.title.format(**doc), doc["lines"], layout.extra))
    console.print(layout.totals.format(**doc))


def invoice(
    tenant_id: Annotated[str, typer.Argument(help="The tenant's id")],
    month: MonthOpt = "",
    server: ServerOpt = DEFAULT_SERVER,
    api_key: ApiKeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """A tenant's monthly invoice (admin, or the tenant's own key)."""
    _show_month(lambda c, m: c.invoice(tenant_id, m), _INVOICE, month, server, api_key, as_json)


def statement(
    provider: Annotated[str, typer.Argument(help="The provider's name")],
    month: MonthOpt = "",
    server: ServerOpt = DEFAULT_SERVER,
    api_key: ApiKeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """A provider's monthly payout statement (admin)."""
    _show_month(lambda c, m: c.statement(provider, m), _STATEMENT, month, server, api_key, as_json)
