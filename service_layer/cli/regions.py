"""Regions and their jurisdictions: an agent only claims one, an admin approves or sets it."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from service_layer.cli.common import DEFAULT_SERVER, ApiKeyOpt, JsonOpt, ServerOpt, api, console, print_json

regions_app = typer.Typer(help="Regions and their jurisdictions.", no_args_is_help=True)


def _status(region: dict[str, Any]) -> str:
    if not region["jurisdiction"]:
        return "-"
    how = "approved" if region["jurisdiction_approved"] else "claimed, unapproved"
    return f"{region['jurisdiction']} ({how})"


@regions_app.command("list")
def list_regions(
    server: ServerOpt = DEFAULT_SERVER, api_key: ApiKeyOpt = None, as_json: JsonOpt = False
) -> None:
    """Regions, their jurisdiction (approved by an admin, or only claimed by an agent) and size."""
    with api(server, api_key) as client:
        rows = client.regions()
    if as_json:
        print_json(rows)
        return
    for r in rows:
        console.print(
            f"{r['name']:<20} {_status(r):<32} clusters {r['clusters']}, nodes {r['alive_nodes']},"
            f" devices {r['devices']}"
            + (f", {r['measuring_nodes']} measuring" if r.get("measuring_nodes") else ""),
            markup=False,
        )


@regions_app.command("set-jurisdiction")
def set_jurisdiction(
    region: Annotated[str, typer.Argument(help="The region, e.g. eu-west")],
    jurisdiction: Annotated[str, typer.Argument(help="Upper-case, e.g. EU")],
    reason: Annotated[str, typer.Option(help="Why, for the audit log")] = "",
    server: ServerOpt = DEFAULT_SERVER,
    api_key: ApiKeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Admins: set and approve a region's jurisdiction (audited). Data residency trusts only
    approved jurisdictions; agents claiming another one are refused at registration."""
    with api(server, api_key) as client:
        row = client.set_jurisdiction(region, jurisdiction, reason)
    if as_json:
        print_json(row)
        return
    console.print(f"region {row['name']}: jurisdiction {_status(row)}", markup=False)
