"""Fixtures: a real control plane per test (REST + gRPC on loopback port 0), admin and tenant clients."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from service_layer.client import CpnClient
from service_layer.server import ServerHandle, start_server_in_thread
from tests.conftest import settings_for
from tests.service_layer.harness import ADMIN_KEY


@pytest.fixture
def server(db_url: str, tmp_path: Path) -> Iterator[ServerHandle]:
    # Slow heartbeats: nodes registered by a test stay alive for the whole test without an agent.
    settings = settings_for(
        db_url,
        data_dir=tmp_path,
        http_port=0,
        grpc_port=0,
        admin_api_key=ADMIN_KEY,
        heartbeat_interval_s=10.0,
        heartbeat_misses=6,
    )
    handle = start_server_in_thread(settings)
    yield handle
    handle.stop()


@pytest.fixture
def admin(server: ServerHandle) -> Iterator[CpnClient]:
    with CpnClient(server.http_url, ADMIN_KEY) as client:
        yield client
