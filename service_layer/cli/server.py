"""``cpn server``: the control plane (REST + gRPC + background loops) in one process, or in
``--workers`` processes sharing its ports."""

from __future__ import annotations

import logging
from typing import Annotated

import typer
from pydantic import ValidationError

from contracts.errors import CpnError
from contracts.lifetime import die_with_parent
from service_layer.cli.common import fail


def server_command(
    http_host: Annotated[str | None, typer.Option("--host", help="REST bind address [CPN_HTTP_HOST]")] = None,
    http_port: Annotated[
        int | None, typer.Option("--port", help="REST port, 0 = any free [CPN_HTTP_PORT]")
    ] = None,
    grpc_host: Annotated[
        str | None, typer.Option("--grpc-host", help="gRPC bind address [CPN_GRPC_HOST]")
    ] = None,
    grpc_port: Annotated[int | None, typer.Option("--grpc-port", help="gRPC port [CPN_GRPC_PORT]")] = None,
    grpc_enroll_port: Annotated[
        int | None, typer.Option("--grpc-enroll-port", help="mTLS enrollment port [CPN_GRPC_ENROLL_PORT]")
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers", help="Processes sharing the ports, about one per core; PostgreSQL only [CPN_WORKERS]"
        ),
    ] = None,
    log_level: Annotated[str, typer.Option("--log-level", envvar="CPN_LOG_LEVEL")] = "INFO",
) -> None:
    """Run the control plane until SIGINT/SIGTERM. Everything else comes from CPN_* variables
    (TLS: CPN_TLS_CERT_FILE, CPN_TLS_KEY_FILE, CPN_TLS_CLIENT_CA_FILE, CPN_TLS_CLIENT_CA_KEY_FILE)."""
    die_with_parent()  # a worker of `cpn server --workers`, or a benchmark's replica
    from orchestration.settings import Settings
    from service_layer.server import serve

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    overrides = {
        k: v
        for k, v in {
            "http_host": http_host,
            "http_port": http_port,
            "grpc_host": grpc_host,
            "grpc_port": grpc_port,
            "grpc_enroll_port": grpc_enroll_port,
            "workers": workers,
        }.items()
        if v is not None
    }
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "settings"
            typer.echo(f"cpn server: {where}: {err['msg']}", err=True)
        raise typer.Exit(2) from None
    if settings.environment != "development" and not settings.admin_api_key:
        logging.getLogger(__name__).warning("CPN_ADMIN_API_KEY is not set: no admin can sign in")
    try:
        serve(settings)
    except OSError as exc:
        fail(f"cannot start: {exc}")
    except CpnError as exc:  # e.g. an unreadable TLS file
        fail(f"cannot start: {exc.message}")
