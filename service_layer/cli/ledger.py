"""Ledger commands: transactions, a tenant's invoice, a provider's payout statement."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.table import Table

from service_layer.cli.common import DEFAULT_SERVER, ApiKeyOpt, JsonOpt, ServerOpt, api, console, print_json

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


def _lines(title: str, lines: list[dict[str, Any]], payout: bool) -> Table:
    table = Table(title=title)
    cols = ["job", "kind", "region", "provider", "quantity", "unit price", "amount"]
    for col in cols + (["fee", "payout"] if payout else []):
        table.add_column(col)
    for line in lines:
        row = [
            line["job_name"] or line["job_id"][:12],
            line["kind"],
            line["region"],
            line["provider"],
            f"{line['quantity']:.6g} {line['unit']}",
            f"{line['unit_price']:g}",
            line["amount"],
        ]
        table.add_row(*row, *([line["fee"], line["payout"]] if payout else []))
    return table


def invoice(
    tenant_id: Annotated[str, typer.Argument(help="The tenant's id")],
    month: MonthOpt = "",
    server: ServerOpt = DEFAULT_SERVER,
    api_key: ApiKeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """A tenant's monthly invoice (admin, or the tenant's own key)."""
    with api(server, api_key) as client:
        doc = client.invoice(tenant_id, month or _this_month())
    if as_json:
        print_json(doc)
        return
    console.print(
        _lines(f"invoice {doc['month']}: {doc['tenant_name']} ({doc['account']})", doc["lines"], False)
    )
    console.print(f"total {doc['total']}")


def statement(
    provider: Annotated[str, typer.Argument(help="The provider's name")],
    month: MonthOpt = "",
    server: ServerOpt = DEFAULT_SERVER,
    api_key: ApiKeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """A provider's monthly payout statement (admin)."""
    with api(server, api_key) as client:
        doc = client.statement(provider, month or _this_month())
    if as_json:
        print_json(doc)
        return
    console.print(_lines(f"payout statement {doc['month']}: {doc['account']}", doc["lines"], True))
    console.print(f"gross {doc['gross']}  fees {doc['fees']}  payout {doc['payout']}")
