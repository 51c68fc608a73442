"""The rendezvous of a torchrun group that spans nodes: authenticated and encrypted.

torchrun's own rendezvous puts a TCPStore on node rank 0 that listens on every interface and
authenticates no one: whoever reaches the port reads the group's keys (addresses, NCCL ids) or
writes its own and joins. Here (backend ``cpn-tls``, registered by ``python -m training.launch``):

- node rank 0's store listens on loopback only (a socket bound here, handed to the store);
- the group's port, the one the control plane assigned, is a TLS relay to it: mutual TLS with the
  job's credentials (its CA, the one its sync and checkpoint copies trust, and a certificate naming
  ``GROUP_TLS_SERVER_NAME``), so a process without them cannot even connect, and nothing crosses the
  network in plaintext;
- on every other node a relay on loopback carries the node's store connections (torchrun's agent
  and its workers') to that port over TLS;
- every key the group writes, torchrun's and the workers' process groups', sits under the job's
  store secret: a process that reaches a loopback port without it can neither read nor write them
  (a TCPStore has no listing).

The workers' gloo or NCCL traffic itself is plaintext: the planner sends it across clusters only
over links declared private (``control_layer.planner.cross_cluster.private_between``).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import socket
import ssl
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.distributed.elastic.rendezvous import (
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
    rendezvous_handler_registry,
)

from contracts.sync_config import GROUP_TLS_SERVER_NAME
from contracts.worker_config import NodeGroupSpec

BACKEND = "cpn-tls"
CONFIG_ENV = "CPN_WORKER_CONFIG"  # set by the agent: the worker config holding the group's credentials
DEFAULT_TIMEOUT_S = 600.0  # as torchrun's static rendezvous
CONNECT_RETRY_S = 0.2  # a node waiting for the head's relay to come up


@dataclass(frozen=True)
class GroupCredentials:
    ca_pem: str
    cert_pem: str
    key_pem: str
    secret: str

    @classmethod
    def of(cls, group: NodeGroupSpec) -> GroupCredentials | None:
        if not group.secured:
            return None
        assert group.tls_ca_pem and group.tls_cert_pem and group.tls_key_pem and group.store_secret
        return cls(group.tls_ca_pem, group.tls_cert_pem, group.tls_key_pem, group.store_secret)

    def context(self, server: bool) -> ssl.SSLContext:
        """Mutual TLS with the job's CA: the server requires a client certificate of it, the client
        verifies the server's and the name it carries."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(cadata=self.ca_pem)
        # The ssl module loads a key only from a file: a private one, gone once loaded.
        with tempfile.TemporaryDirectory(prefix="cpn-group-") as d:
            cert, key = Path(d) / "cert.pem", Path(d) / "key.pem"
            cert.write_text(self.cert_pem)
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(self.key_pem)
            ctx.load_cert_chain(cert, key)
        return ctx


def store_prefix(secret: str, part: str) -> str:
    """Where a group's keys live in its store: unguessable without the job's store secret."""
    return f"cpn/{secret}/{part}"


def load_group(path: str | os.PathLike[str]) -> NodeGroupSpec | None:
    """The ``group`` section of a worker config file, validated (None: a group of one node)."""
    config = json.loads(Path(path).read_text())
    group = config.get("group")
    return NodeGroupSpec.model_validate(group) if group is not None else None


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, ssl.SSLError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def _splice(
    a: tuple[asyncio.StreamReader, asyncio.StreamWriter], b: tuple[asyncio.StreamReader, asyncio.StreamWriter]
) -> None:
    await asyncio.gather(_pump(a[0], b[1]), _pump(b[0], a[1]))


class Relay:
    """Store connections forwarded on an event loop of their own thread (the torchrun agent blocks
    its own thread in the store's calls). ``serve_head``: TLS on the group port to the loopback
    store; ``serve_member``: loopback to the head's group port over TLS."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="cpn-group-relay", daemon=True)
        self._thread.start()
        self._server: asyncio.Server | None = None

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def serve_head(self, port: int, store_port: int, tls: ssl.SSLContext) -> None:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                store = await asyncio.open_connection("127.0.0.1", store_port)
            except OSError:
                writer.close()
                return
            await _splice((reader, writer), store)

        async def start() -> asyncio.Server:
            # Every interface, as torchrun's store listened before; only a TLS peer of the job gets in.
            return await asyncio.start_server(handle, None, port, ssl=tls, ssl_handshake_timeout=30)

        self._server = self._run(start())

    def serve_member(self, host: str, port: int, tls: ssl.SSLContext, deadline_s: float) -> int:
        """Listen on a free loopback port; returns it. Each connection waits (until ``deadline_s``
        on the loop's clock) for the head's relay, which may come up after this node."""

        async def upstream() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
            while True:
                try:
                    return await asyncio.open_connection(
                        host, port, ssl=tls, server_hostname=GROUP_TLS_SERVER_NAME, ssl_handshake_timeout=30
                    )
                except (OSError, ssl.SSLError):
                    if self._loop.time() > deadline_s:
                        raise
                    await asyncio.sleep(CONNECT_RETRY_S)

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                head = await upstream()
            except (OSError, ssl.SSLError):
                writer.close()
                return
            await _splice((reader, writer), head)

        async def start() -> asyncio.Server:
            return await asyncio.start_server(handle, "127.0.0.1", 0)

        self._server = self._run(start())
        return int(self._server.sockets[0].getsockname()[1])

    def clock(self) -> float:
        return self._loop.time()

    def close(self) -> None:
        if self._server is not None:
            self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)


def _loopback_listener() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


class SecureRendezvous(RendezvousHandler):
    """torchrun's static rendezvous (node ranks as the control plane gave them), its store behind
    the TLS relays and its keys under the job's secret."""

    def __init__(
        self,
        master_addr: str,
        master_port: int,
        rank: int,
        world_size: int,
        run_id: str,
        timeout_s: float,
        creds: GroupCredentials,
    ) -> None:
        self.master_addr, self.master_port = master_addr, master_port
        self.rank, self.world_size, self.run_id = rank, world_size, run_id
        self.timeout = dt.timedelta(seconds=timeout_s)
        self.creds = creds
        self._store: dist.Store | None = None
        self._local_port = 0
        self._relay: Relay | None = None
        self._listener: socket.socket | None = None

    def get_backend(self) -> str:
        return BACKEND

    @property
    def use_agent_store(self) -> bool:
        return True  # the workers connect to this node's loopback end (``bootstrap_store_info``)

    def _open(self) -> None:
        relay = self._relay = Relay()
        if self.rank == 0:
            self._listener = _loopback_listener()
            self._local_port = int(self._listener.getsockname()[1])
            store = dist.TCPStore(
                "127.0.0.1",
                self._local_port,
                None,
                True,
                self.timeout,
                wait_for_workers=False,
                master_listen_fd=self._listener.fileno(),
            )
            relay.serve_head(self.master_port, self._local_port, self.creds.context(server=True))
        else:
            deadline = relay.clock() + self.timeout.total_seconds()
            self._local_port = relay.serve_member(
                self.master_addr, self.master_port, self.creds.context(server=False), deadline
            )
            store = dist.TCPStore("127.0.0.1", self._local_port, None, False, self.timeout)
        self._store = store

    def next_rendezvous(self) -> RendezvousInfo:
        if self._store is None:
            self._open()
        assert self._store is not None
        store = dist.PrefixStore(store_prefix(self.creds.secret, self.run_id), self._store)
        return RendezvousInfo(
            store, self.rank, self.world_size, RendezvousStoreInfo("127.0.0.1", self._local_port)
        )

    def is_closed(self) -> bool:
        return False

    def set_closed(self) -> None:
        pass

    def num_nodes_waiting(self) -> int:
        return 0

    def get_run_id(self) -> str:
        return self.run_id

    def shutdown(self) -> bool:
        if self._relay is not None:
            self._relay.close()
        return True


def create_handler(params: RendezvousParameters) -> RendezvousHandler:
    """From torchrun's arguments (``--rdzv-endpoint``, ``--nnodes``, ``--rdzv-id``, ``--rdzv-conf
    rank=R``) and the group's credentials in the worker config the agent names (``CPN_WORKER_CONFIG``)."""
    path = os.environ.get(CONFIG_ENV)
    group = load_group(path) if path else None
    creds = GroupCredentials.of(group) if group is not None else None
    if creds is None:
        raise ValueError(f"{BACKEND} rendezvous: no group credentials in ${CONFIG_ENV} ({path!r})")
    host, _, port = params.endpoint.strip().rpartition(":")
    rank = int(params.config.get("rank", -1))
    if not host or not port.isdigit() or not 0 <= rank < params.max_nodes:
        raise ValueError(
            f"{BACKEND} rendezvous: endpoint {params.endpoint!r}, rank {rank} of {params.max_nodes}"
        )
    timeout = float(params.config.get("timeout", DEFAULT_TIMEOUT_S))
    return SecureRendezvous(
        host.strip("[]"), int(port), rank, params.max_nodes, params.run_id, timeout, creds
    )


def register() -> None:
    """Make ``--rdzv-backend cpn-tls`` known to torchrun in this process."""
    with contextlib.suppress(ValueError):  # registered already
        rendezvous_handler_registry.register(BACKEND, create_handler)


def worker_store(secret: str, timeout: dt.timedelta) -> dist.Store:
    """A worker's store for its process group: the node's loopback end of the rendezvous
    (``MASTER_ADDR``/``MASTER_PORT``, as torchrun gives them), its keys under the job's secret."""
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False, timeout)
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(store_prefix(secret, f"workers/{restart}"), store)
