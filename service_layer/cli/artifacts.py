"""``cpn artifacts``: upload, list and delete what the artifact store keeps for the tenant."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from service_layer.cli.common import (
    DEFAULT_SERVER,
    ApiKeyOpt,
    JsonOpt,
    ServerOpt,
    api,
    console,
    err_console,
    print_json,
)
from service_layer.transfers import ProgressLine

artifacts_app = typer.Typer(help="The artifact store: your code, data and models.", no_args_is_help=True)

KINDS = ("code", "data", "model", "checkpoint", "other")


def progress_line(name: str) -> ProgressLine:
    """Transfer progress on stderr (stdout stays for results and --json)."""

    def write(text: str) -> None:
        err_console.file.write(text)
        err_console.file.flush()

    return ProgressLine(name, write)


def size_text(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


@artifacts_app.command("upload")
def upload(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True, help="The file")],
    kind: Annotated[str, typer.Option(help=" | ".join(KINDS))] = "data",
    name: Annotated[str | None, typer.Option(help="Label (default: the file's name)")] = None,
    server: ServerOpt = DEFAULT_SERVER,
    api_key: ApiKeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Upload a file; prints its `artifact:sha256:...` URI for data.source or data.shards."""
    if kind not in KINDS:
        raise typer.BadParameter(f"--kind must be one of {', '.join(KINDS)}")
    with api(server, api_key) as client:
        row = client.upload_artifact(file, name=name, kind=kind, progress=progress_line(file.name))
    if as_json:
        print_json(row)
        return
    console.print(f"{row['uri']}  {size_text(row['bytes'])}  ({row['kind']}, id {row['id']})", markup=False)


@artifacts_app.command("list")
def list_artifacts(
    kind: Annotated[str | None, typer.Option(help="Only this kind")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 100,
    server: ServerOpt = DEFAULT_SERVER,
    api_key: ApiKeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Your artifacts, newest first."""
    with api(server, api_key) as client:
        rows = client.artifacts(kind=kind, limit=limit)
    if as_json:
        print_json(rows)
        return
    table = Table(title="artifacts")
    for col in ("id", "name", "kind", "size", "digest", "job", "expires"):
        table.add_column(col, no_wrap=col != "name")
    for r in rows:
        table.add_row(
            r["id"],
            r["name"],
            r["kind"],
            size_text(r["bytes"]),
            r["digest"][:19] + "…",
            (r.get("job_id") or "")[:8],
            str(r["expires_at"])[:10],
        )
    console.print(table)


@artifacts_app.command("delete")
def delete(
    artifact_id: Annotated[str, typer.Argument(help="The artifact's id")],
    server: ServerOpt = DEFAULT_SERVER,
    api_key: ApiKeyOpt = None,
) -> None:
    """Delete an artifact (frees its quota)."""
    with api(server, api_key) as client:
        row = client.delete_artifact(artifact_id)
    console.print(f"deleted {row['id']} ({row['name'] or row['digest']})", markup=False)
