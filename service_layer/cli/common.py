"""What every client command shares: server/key options, the client, spec files, error display."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console

from service_layer.client import ApiError, CpnClient

console = Console()
err_console = Console(stderr=True)

DEFAULT_SERVER = "http://127.0.0.1:8080"

ServerOpt = Annotated[
    str, typer.Option("--server", envvar="CPN_SERVER_URL", help="Control plane REST URL", show_default=True)
]
ApiKeyOpt = Annotated[
    str | None,
    typer.Option("--api-key", envvar="CPN_API_KEY", help="Tenant API key (Bearer)", show_default=False),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables")]


def load_spec(path: Path) -> dict[str, Any]:
    """Read and validate a YAML/JSON job spec locally, so a bad field is named before any request."""
    from contracts.errors import InvalidArgument
    from contracts.job_spec import JobSpec

    try:
        text = path.read_text()
    except OSError as exc:
        fail(f"cannot read job spec {path}: {exc.strerror}", code=2)
    try:
        return JobSpec.from_yaml_or_json(text).model_dump(mode="json", exclude_unset=True)
    except InvalidArgument as exc:
        for e in exc.details.get("errors", []):
            err_console.print(f"[red]{path}: {e['field']}: {e['message']}[/]")
        fail(exc.message if not exc.details.get("errors") else f"invalid job spec {path}", code=2)
    raise AssertionError("unreachable")


def fail(message: str, code: int = 1) -> None:
    err_console.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(code)


@contextmanager
def api(server: str, api_key: str | None) -> Iterator[CpnClient]:
    """A client whose errors end the command with a readable message (exit 1)."""
    client = CpnClient(server, api_key)
    try:
        yield client
    except ApiError as exc:
        for e in exc.details.get("errors", []) if isinstance(exc.details.get("errors"), list) else []:
            err_console.print(f"[red]  {e.get('field')}: {e.get('message')}[/]")
        explanation = exc.details.get("explanation")
        if explanation:
            err_console.print("[yellow]planner explanation:[/]")
            for line in explanation if isinstance(explanation, list) else [explanation]:
                err_console.print(f"  {json.dumps(line) if not isinstance(line, str) else line}")
        fail(f"{exc.status} {exc.code}: {exc.message}")
    except httpx.TransportError as exc:
        fail(f"cannot reach the control plane at {server}: {exc.__class__.__name__}: {exc}")
    finally:
        client.close()


def print_json(value: Any) -> None:
    console.print_json(json.dumps(value, default=str))
