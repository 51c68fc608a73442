"""API keys with roles (tenant-admins, admins) and an operator's actions on nodes."""

from __future__ import annotations

from typing import Annotated

import typer

from service_layer.cli.common import DEFAULT_SERVER, ApiKeyOpt, JsonOpt, ServerOpt, api, console, print_json

keys_app = typer.Typer(help="API keys and their roles.", no_args_is_help=True)
nodes_app = typer.Typer(
    help="List, cordon, drain and revoke nodes (operator or admin).", no_args_is_help=True
)

ReasonOpt = Annotated[str, typer.Option(help="Why, for the audit log (and the agent, on a drain)")]


@keys_app.command("list")
def list_keys(
    tenant_id: Annotated[str | None, typer.Option(help="Admin: one tenant's keys only")] = None,
    server: ServerOpt = DEFAULT_SERVER,
    api_key: ApiKeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Your tenant's keys (an admin: every tenant's), revoked ones included."""
    with api(server, api_key) as client:
        rows = client.keys(tenant_id)
    if as_json:
        print_json(rows)
        return
    for k in rows:
        state = f"revoked {k['revoked_at']}" if k["revoked_at"] else "active"
        console.print(
            f"{k['id']}  {k['prefix']}…  {k['role']:<12}  {k['name'] or '-'}  {state}", markup=False
        )


@keys_app.command("create")
def create_key(
    role: Annotated[
        str, typer.Option(help="member | tenant-admin (admins: also operator, admin)")
    ] = "member",
    name: Annotated[str, typer.Option(help="The member who holds it")] = "",
    tenant_id: Annotated[str | None, typer.Option(help="Admin: for this tenant (default: your own)")] = None,
    server: ServerOpt = DEFAULT_SERVER,
    api_key: ApiKeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """A new key with a role (tenant-admin or admin); shown once."""
    with api(server, api_key) as client:
        key = client.add_key(role=role, name=name, tenant_id=tenant_id)
    if as_json:
        print_json(key)
        return
    console.print(
        f"{key['role']} key {key['id']} for {key['name'] or 'tenant ' + key['tenant_id']} (shown once):"
    )
    console.print(key["key"], markup=False, highlight=False)


@keys_app.command("revoke")
def revoke_key(
    key_id: str, server: ServerOpt = DEFAULT_SERVER, api_key: ApiKeyOpt = None, as_json: JsonOpt = False
) -> None:
    """Revoke a key: refused at once by this server, by other replicas within seconds."""
    with api(server, api_key) as client:
        key = client.revoke_key(key_id)
    if as_json:
        print_json(key)
        return
    console.print(f"key {key['id']} ({key['role']}) revoked at {key['revoked_at']}")


def _node_action(
    action: str, node_id: str, reason: str, server: str, api_key: str | None, as_json: bool
) -> None:
    with api(server, api_key) as client:
        out = client.node_action(node_id, action, reason)
    if as_json:
        print_json(out)
        return
    console.print(f"node {out['node_id']}: status {out['status']}, cordon {out['cordon'] or 'none'}")
    if out["moved_jobs"]:
        console.print(f"moved: {', '.join(out['moved_jobs'])}")
    if out["running_jobs"]:
        console.print(f"still running there: {', '.join(out['running_jobs'])}")
    if out["note"]:
        console.print(out["note"], markup=False)


@nodes_app.command("list")
def list_nodes(
    server: ServerOpt = DEFAULT_SERVER, api_key: ApiKeyOpt = None, as_json: JsonOpt = False
) -> None:
    """Every node by region and cluster: alive (placeable), measuring (registered, its profile not
    in yet: not placed), lost, revoked or drained; its hold and its devices."""
    with api(server, api_key) as client:
        clusters = client.clusters()
    rows = [(c, n) for c in clusters for n in c["nodes"]]
    if as_json:
        print_json([{"region": c["region"], "cluster": c["name"], **n} for c, n in rows])
        return
    if not rows:
        console.print("no nodes")
    for c, n in rows:
        devices = ", ".join(f"{d['kind']}:{d['index']}{'*' if d['allocated'] else ''}" for d in n["devices"])
        console.print(
            f"{n['id']}  {c['region']}/{c['name']}  {n['hostname'] or '-'}  {n['status']:<9}"
            f"  {n['cordon'] or 'open':<9}  {devices or 'no devices'}",
            markup=False,
        )


@nodes_app.command("cordon")
def cordon(
    node_id: str,
    reason: ReasonOpt = "",
    server: ServerOpt = DEFAULT_SERVER,
    api_key: ApiKeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """No new placements on the node; what runs there keeps running."""
    _node_action("cordon", node_id, reason, server, api_key, as_json)


@nodes_app.command("uncordon")
def uncordon(
    node_id: str,
    reason: ReasonOpt = "",
    server: ServerOpt = DEFAULT_SERVER,
    api_key: ApiKeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Open the node to placements again."""
    _node_action("uncordon", node_id, reason, server, api_key, as_json)


@nodes_app.command("drain")
def drain(
    node_id: str,
    reason: ReasonOpt = "",
    server: ServerOpt = DEFAULT_SERVER,
    api_key: ApiKeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Cordon the node, tell its agent to drain, move its jobs elsewhere."""
    _node_action("drain", node_id, reason, server, api_key, as_json)


@nodes_app.command("revoke")
def revoke(
    node_id: str,
    reason: ReasonOpt = "",
    server: ServerOpt = DEFAULT_SERVER,
    api_key: ApiKeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Shut the node out: its credentials stop working, its tasks move elsewhere."""
    _node_action("revoke", node_id, reason, server, api_key, as_json)
