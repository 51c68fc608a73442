"""``cpn queue``: the admission queue, in order, with why each job waits."""

from __future__ import annotations

from rich.table import Table

from service_layer.cli.common import DEFAULT_SERVER, ApiKeyOpt, JsonOpt, ServerOpt, api, console, print_json


def queue(server: ServerOpt = DEFAULT_SERVER, api_key: ApiKeyOpt = None, as_json: JsonOpt = False) -> None:
    """Queued jobs in admission order: your own (an admin sees every tenant's)."""
    with api(server, api_key) as client:
        entries = client.queue()
    if as_json:
        print_json(entries)
        return
    table = Table(title=f"queue ({len(entries)} waiting)")
    for col in ("pos", "job", "name", "tenant", "prio", "submitted", "reason"):
        table.add_column(col)
    for e in entries:
        table.add_row(
            str(e["position"]) if e["position"] is not None else "–",
            e["job_id"][:12],
            e["name"],
            e["tenant_id"][:12],
            str(e["priority"]),
            e["submitted_at"][:19],
            e["reason"] or "",
        )
    console.print(table)
