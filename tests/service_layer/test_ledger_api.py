"""The ledger over REST and the CLI: a finished job's charges as balanced transactions, the
tenant's invoice and the provider's statement for the month, who may read what, and bad input."""

from __future__ import annotations

import time
from decimal import Decimal

import pytest
from typer.testing import CliRunner

from control_layer.reactions import on_task_metrics, on_task_status
from cpn.cli import app
from service_layer.client import ApiError, CpnClient
from service_layer.server import ServerHandle
from tests.service_layer.harness import ADMIN_KEY, new_tenant, seed_fleet, small_spec, wait_placed


def _run_job(server: ServerHandle, client: CpnClient) -> dict:
    """Submit and report what workers would: running, WAN bytes sent, then success."""
    job = wait_placed(client, client.submit(spec=small_spec(steps=5), choice="cheapest")["id"])
    for t in job["tasks"]:
        on_task_status(server.ctx, t["node_id"], t["id"], "running")
    for t in job["tasks"]:
        on_task_metrics(
            server.ctx, t["node_id"], t["id"], {"step": 1, "loss": 2.0, "wan_bytes_sent": 3_000_000}
        )
    time.sleep(0.3)  # a measurable billed span
    for t in job["tasks"]:
        on_task_status(server.ctx, t["node_id"], t["id"], "succeeded", "", 0, {"wan_bytes_sent": 7_000_000})
    done = client.job(job["id"])
    assert done["status"] == "succeeded", done["reason"]
    return done


def _status(call: object) -> int:
    with pytest.raises(ApiError) as err:
        call()  # type: ignore[operator]
    return err.value.status


def test_ledger_invoice_and_statement_over_rest(server: ServerHandle, admin: CpnClient) -> None:
    seed_fleet(server, admin)
    tenant, client = new_tenant(admin, server, "acme")
    other, other_client = new_tenant(admin, server, "globex")
    with client, other_client:
        done = _run_job(server, client)
        page = client.transactions(job_id=done["id"])
        txs = page["transactions"]
        assert txs and page["next_cursor"] is None
        for tx in txs:
            assert sum(Decimal(p["amount"]) for p in tx["postings"]) == 0
            assert tx["tenant_id"] == tenant["id"]
        kinds = {tx["kind"] for tx in txs}
        assert "gpu" in kinds
        charged = sum(Decimal(tx["amount"]) for tx in txs)
        assert float(charged) == done["actual_cost"] and charged > 0
        assert other_client.transactions()["transactions"] == []  # a tenant sees only its own charges
        everything = admin.transactions(account=f"tenant:{tenant['id']}")["transactions"]
        assert [t["id"] for t in everything] == [t["id"] for t in txs]
        first = admin.transactions(limit=1)
        assert len(first["transactions"]) == 1 and first["next_cursor"] == first["transactions"][0]["id"]
        rest = admin.transactions(after=first["next_cursor"])["transactions"]
        assert [first["transactions"][0]["id"], *[t["id"] for t in rest]] == [t["id"] for t in txs]

        month = txs[0]["period_start"][:7]
        invoice = client.invoice(tenant["id"], month)
        assert Decimal(invoice["total"]) == charged
        assert sum(Decimal(line["amount"]) for line in invoice["lines"]) == charged
        assert {line["job_id"] for line in invoice["lines"]} == {done["id"]}
        assert admin.invoice(tenant["id"], month) == invoice
        assert Decimal(other_client.invoice(other["id"], month)["total"]) == 0
        assert _status(lambda: other_client.invoice(tenant["id"], month)) == 403
        assert _status(lambda: admin.invoice("nosuchtenant", month)) == 404

        statement = admin.statement("acme", month)
        gpu = sum(Decimal(tx["amount"]) for tx in txs if tx["kind"] == "gpu")
        fees = sum(
            -Decimal(p["amount"]) for tx in txs for p in tx["postings"] if p["account"] == "platform:fees"
        )
        assert Decimal(statement["gross"]) == gpu
        assert Decimal(statement["fees"]) == fees
        assert (
            Decimal(statement["payout"])
            == gpu - fees
            == sum(Decimal(line["payout"]) for line in statement["lines"])
        )
        assert abs(fees - gpu * Decimal("0.1")) <= Decimal("0.000001") * len(txs)  # the default 10 % fee
        assert _status(lambda: client.statement("acme", month)) == 403
        assert _status(lambda: admin.statement("nobody", month)) == 404

        for bad in ("2026-13", "2026-1", "1969-12", "november"):
            with pytest.raises(ApiError) as err:
                admin.invoice(tenant["id"], bad)
            assert err.value.status == 422 and "month" in str(err.value.details), bad
        assert _status(lambda: admin.transactions(limit=0)) == 422
        assert _status(lambda: admin.transactions(job_id="x" * 33)) == 422

    env = {"CPN_SERVER_URL": server.http_url, "CPN_API_KEY": ADMIN_KEY, "COLUMNS": "200"}
    outputs = []
    for args in (
        ["ledger", "transactions", "--job", done["id"]],
        ["invoice", tenant["id"], "--month", month],
        ["statement", "acme", "--month", month],
    ):
        result = CliRunner().invoke(app, args, env=env)
        assert result.exit_code == 0, result.output
        outputs.append(result.output)
    _, invoice_out, statement_out = outputs
    assert f"invoice {month}: acme ({invoice['account']})" in invoice_out
    assert invoice_out.rstrip().endswith(f"total {invoice['total']}")
    assert f"payout statement {month}: {statement['account']}" in statement_out
    assert "fee" in statement_out.splitlines()[2] and "fee" not in invoice_out.splitlines()[2]  # headers
    assert statement_out.rstrip().endswith(
        f"gross {statement['gross']}  fees {statement['fees']}  payout {statement['payout']}"
    )
    bad = CliRunner().invoke(app, ["invoice", tenant["id"], "--month", "2026-13"], env=env)
    assert bad.exit_code == 1 and "422" in bad.output
