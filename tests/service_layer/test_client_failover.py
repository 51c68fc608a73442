"""The REST client given several replicas' URLs goes on to the next when one cannot be reached."""

from __future__ import annotations

import socket
import struct
import threading
from pathlib import Path

import httpx
import pytest

from orchestration.settings import Settings
from service_layer.client import CpnClient
from service_layer.server import start_server_in_thread
from tests.processes import free_port

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


class _ResetsSecondRequest:
    """A loopback HTTP/1.1 server that answers a connection's first request and resets the
    connection at its second, as a server does whose keep-alive timer fired as the request came."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.requests: list[str] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as reader:
            for index in range(2):
                line = reader.readline().decode()
                if not line:
                    return
                self.requests.append(line.split(" ")[0])
                length = 0
                while (header := reader.readline()) not in (b"\r\n", b""):
                    if header.lower().startswith(b"content-length:"):
                        length = int(header.split(b":")[1])
                reader.read(length)
                if index == 1:  # linger 0: close() sends RST
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return
                body = b"[]"
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )

    def close(self) -> None:
        self.sock.close()


def test_a_read_on_a_reset_kept_alive_connection_is_asked_again_and_a_write_is_not() -> None:
    server = _ResetsSecondRequest()
    try:
        with CpnClient(server.url, ADMIN_KEY) as client:
            assert client.jobs() == []
            assert client.jobs() == []  # reset on the kept-alive connection, answered on a new one
            assert server.requests == ["GET", "GET", "GET"]
            with pytest.raises((httpx.ReadError, httpx.RemoteProtocolError)):
                client.create_token("acme")  # the second request on that new connection: a write
            assert server.requests == ["GET", "GET", "GET", "POST"]
    finally:
        server.close()
