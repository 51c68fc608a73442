"""Admin commands: enrollment tokens, tenants and keys, the snapshot, database migrations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from service_layer.cli.common import DEFAULT_SERVER, ApiKeyOpt, JsonOpt, ServerOpt, api, console, print_json

tokens_app = typer.Typer(help="Enrollment tokens for agents.", no_args_is_help=True)
tenants_app = typer.Typer(help="Tenants and their API keys.", no_args_is_help=True)
snapshot_app = typer.Typer(help="The planner's view of the fleet.", no_args_is_help=True)
db_app = typer.Typer(help="The control plane's database.", no_args_is_help=True)


@tokens_app.command("create")
def create_token(
    provider: Annotated[
        str, typer.Option(help="The provider whose nodes it enrolls (only into its clusters)")
    ],
    note: Annotated[str, typer.Option(help="What the token is for")] = "",
    ttl_s: Annotated[float, typer.Option("--ttl-s", min=1, help="Seconds until it expires")] = 86_400.0,
    max_uses: Annotated[int, typer.Option(min=1, help="Registrations it allows")] = 1,
    server: ServerOpt = DEFAULT_SERVER,
    api_key: ApiKeyOpt = None,
    as_json: JsonOpt = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only the token (for scripts)")] = False,
) -> None:
    """Issue an enrollment token (admin); give it to `cpn agent --token`."""
    with api(server, api_key) as client:
        tok = client.create_token(provider=provider, note=note, ttl_s=ttl_s, max_uses=max_uses)
    if as_json:
        print_json(tok)
        return
    if quiet:
        typer.echo(tok["token"])
        return
    console.print(
        f"enrollment token for provider {tok['provider']} (shown once, {tok['max_uses']} use(s),"
        f" expires {tok['expires_at']}):"
    )
    console.print(tok["token"], markup=False, highlight=False)


@tenants_app.command("create")
def create_tenant(
    name: Annotated[str, typer.Argument(help="Unique lower-case name")],
    admin: Annotated[
        bool, typer.Option("--admin", help="The platform tenant: its keys may be admin or operator")
    ] = False,
    server: ServerOpt = DEFAULT_SERVER,
    api_key: ApiKeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a tenant and its first API key (admin); the key is shown once."""
    with api(server, api_key) as client:
        tenant = client.create_tenant(name, is_admin=admin)
        key = client.create_key(tenant["id"])
    if as_json:
        print_json({"tenant": tenant, "key": key})
        return
    console.print(f"tenant [bold]{tenant['name']}[/] {tenant['id']}; API key (shown once):")
    console.print(key["key"], markup=False, highlight=False)


@tenants_app.command("add-key")
def add_key(tenant_id: str, server: ServerOpt = DEFAULT_SERVER, api_key: ApiKeyOpt = None) -> None:
    """Another API key for an existing tenant (admin); shown once."""
    with api(server, api_key) as client:
        key = client.create_key(tenant_id)
    console.print(key["key"], markup=False, highlight=False)


@tenants_app.command("quota")
def set_quota(
    tenant_id: str,
    max_devices: Annotated[
        int | None, typer.Option(min=0, help="Devices its jobs may hold at once (omit: unlimited)")
    ] = None,
    max_monthly_spend: Annotated[
        float | None, typer.Option(min=0, help="Spend cap per calendar month, UTC (omit: none)")
    ] = None,
    max_artifact_bytes: Annotated[
        int | None, typer.Option(min=0, help="Bytes of artifacts it may keep (omit: the server's default)")
    ] = None,
    server: ServerOpt = DEFAULT_SERVER,
    api_key: ApiKeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Set a tenant's quotas (admin): all are replaced; an option left out removes that quota."""
    with api(server, api_key) as client:
        tenant = client.set_quota(
            tenant_id,
            max_devices=max_devices,
            max_monthly_spend=max_monthly_spend,
            max_artifact_bytes=max_artifact_bytes,
        )
    if as_json:
        print_json(tenant)
        return
    devices = tenant["max_devices"] if tenant["max_devices"] is not None else "unlimited"
    spend = tenant["max_monthly_spend"] if tenant["max_monthly_spend"] is not None else "none"
    console.print(f"tenant [bold]{tenant['name']}[/]: max_devices {devices}, max_monthly_spend {spend}")


@snapshot_app.command("export")
def export_snapshot(
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="File to write (default: stdout)")
    ] = None,
    server: ServerOpt = DEFAULT_SERVER,
    api_key: ApiKeyOpt = None,
) -> None:
    """Save the live resource snapshot (admin) for offline planning with `cpn plan`."""
    with api(server, api_key) as client:
        snap = client.snapshot()
    text = json.dumps(snap, indent=2)
    if output is None:
        typer.echo(text)
    else:
        output.write_text(text + "\n")
        console.print(f"wrote {output} ({len(snap.get('clusters', []))} clusters)")


@db_app.command("upgrade")
def db_upgrade(
    database_url: Annotated[
        str | None,
        typer.Option("--database-url", envvar="CPN_DATABASE_URL", help="Default: from CPN_* settings"),
    ] = None,
) -> None:
    """Migrate the database to the newest schema (idempotent)."""
    from orchestration.db.migrate import head_revision
    from orchestration.settings import Settings
    from service_layer.server import prepare_database

    settings = Settings(database_url=database_url) if database_url else Settings()
    prepare_database(settings)
    console.print(f"database at revision {head_revision()}")


@tokens_app.command("list")
def list_tokens(
    server: ServerOpt = DEFAULT_SERVER, api_key: ApiKeyOpt = None, as_json: JsonOpt = False
) -> None:
    """Enrollment tokens with their uses, expiry and revocation (operator or admin)."""
    with api(server, api_key) as client:
        rows = client.tokens()
    if as_json:
        print_json(rows)
        return
    for t in rows:
        state = "revoked" if t["revoked_at"] else f"{t['uses']}/{t['max_uses'] or 'unlimited'} used"
        console.print(
            f"{t['id']}  {t['provider']}  {state}  expires {t['expires_at']}  {t['note']}", markup=False
        )


@tokens_app.command("revoke")
def revoke_token(
    token_id: str, server: ServerOpt = DEFAULT_SERVER, api_key: ApiKeyOpt = None, as_json: JsonOpt = False
) -> None:
    """Revoke an enrollment token (operator or admin): it enrolls nothing after."""
    with api(server, api_key) as client:
        row = client.revoke_token(token_id)
    if as_json:
        print_json(row)
        return
    console.print(f"token {row['id']} revoked at {row['revoked_at']}")
