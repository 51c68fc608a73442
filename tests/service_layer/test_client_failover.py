"""The REST client given several replicas' URLs goes on to the next when one cannot be reached."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from orchestration.settings import Settings
from service_layer.client import CpnClient
from service_layer.server import start_server_in_thread
from tests.integration.test_restart import free_port

ADMIN_KEY = "cpn_admin_" + "k" * 32


def test_client_fails_over_to_a_replica_that_answers(tmp_path: Path) -> None:
    settings = Settings(
        environment="development", data_dir=tmp_path, http_port=0, grpc_port=0, admin_api_key=ADMIN_KEY
    )
    dead = f"http://127.0.0.1:{free_port()}"
    with start_server_in_thread(settings) as handle:
        with CpnClient(f"{dead},{handle.http_url}", ADMIN_KEY) as client:
            assert client.jobs() == []  # the first address refused the connection
            assert client.base_url == handle.http_url
        with CpnClient(dead, ADMIN_KEY) as client, pytest.raises(httpx.ConnectError):
            client.jobs()
