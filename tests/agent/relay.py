"""A TCP relay on loopback that records every byte it forwards, both ways: what a wire tap between
two nodes would capture."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class RecordingRelay:
    """Listens on 127.0.0.1 (``port``), forwards each connection to ``target``, and keeps the bytes
    in ``sent`` (client to server) and ``received`` (server to client)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.sent = bytearray()
        self.received = bytearray()
        self.connections = 0
        self.port = 0
        self._server: asyncio.Server | None = None
        self._pumps: set[asyncio.Task[None]] = set()

    @property
    def captured(self) -> bytes:
        return bytes(self.sent + self.received)

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, into: bytearray
    ) -> None:
        try:
            while data := await reader.read(1 << 16):
                into += data
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        pumps = [
            asyncio.create_task(self._pump(reader, up_writer, self.sent)),
            asyncio.create_task(self._pump(up_reader, writer, self.received)),
        ]
        self._pumps.update(pumps)
        await asyncio.gather(*pumps, return_exceptions=True)
        self._pumps.difference_update(pumps)

    async def start(self) -> RecordingRelay:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._pumps):
            task.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)


@contextlib.asynccontextmanager
async def recording_relay(host: str, port: int) -> AsyncIterator[RecordingRelay]:
    relay = await RecordingRelay(host, port).start()
    try:
        yield relay
    finally:
        await relay.stop()
