"""What a process's sockets put on the wire, from the kernel's per-socket TCP counters.

Per socket: the payload bytes TCP sent (``tcpi_bytes_sent``, retransmissions included) plus, for
every segment it sent (``tcpi_segs_out``: data, pure ACKs, SYN and FIN alike), the headers each
one carries on an Ethernet link:

- Ethernet: 14 bytes (destination, source, EtherType), as Linux interface counters count a frame:
  no preamble, no frame check sequence, no inter-frame gap;
- IP: 20 bytes for IPv4 (no options; Linux sets none on TCP), 40 for IPv6;
- TCP: 20 bytes, plus 12 on every segment when timestamps were negotiated (10 for the option,
  2 of NOP padding), which Linux does by default.

66 bytes a segment over IPv4 with timestamps. Not counted: the longer options of the SYN and
SYN-ACK (8 bytes more each, once per connection) and SACK blocks on ACKs after a loss (10 + 8 a
block): a few bytes a connection, and a few per lost segment.

Counters only grow while a socket lives, and a socket's last reading stands once it is closed, so
the total never falls. Where the kernel does not answer (no inet_diag, a kernel older than 4.19),
the count is unavailable (None), never 0.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from training.wan.inet_diag import DiagUnavailable, TcpSocket, dump_tcp, own_socket_inodes

ETHERNET_HEADER = 14
IPV4_HEADER, IPV6_HEADER = 20, 40
TCP_HEADER, TCP_TIMESTAMPS = 20, 12
_U32 = 1 << 32


def header_bytes(ipv4: bool, timestamps: bool) -> int:
    """Header bytes of one TCP segment in an Ethernet frame (see the module's docstring)."""
    return (
        ETHERNET_HEADER
        + (IPV4_HEADER if ipv4 else IPV6_HEADER)
        + TCP_HEADER
        + (TCP_TIMESTAMPS if timestamps else 0)
    )


class _Socket:
    """One socket's latest reading; segments counted past the kernel's 32-bit wrap."""

    def __init__(self, s: TcpSocket) -> None:
        self.header = header_bytes(s.ipv4, s.timestamps)
        self.raw_segs = s.segs_out
        self.segs = s.segs_out
        self.payload = s.bytes_sent or 0

    def update(self, s: TcpSocket) -> None:
        self.segs += (s.segs_out - self.raw_segs) % _U32
        self.raw_segs = s.segs_out
        self.payload = max(self.payload, s.bytes_sent or 0)

    @property
    def wire(self) -> int:
        return self.payload + self.segs * self.header


class WireCounter:
    """Bytes sent on the wire by this process's TCP sockets that ``matches`` picks.

    A socket is picked while this process holds it (by inode, from ``/proc/self/fd``) and is
    followed by its kernel cookie after that, so the segments of its close are counted where a
    reading catches them. ``sample`` reads the kernel at most every ``min_interval_s`` unless
    forced, and returns the total (None where the kernel's counters cannot be read).
    """

    def __init__(
        self,
        matches: Callable[[TcpSocket], bool],
        min_interval_s: float = 1.0,
        dump: Callable[[], list[TcpSocket]] = dump_tcp,
    ) -> None:
        self.matches, self.dump = matches, dump
        self.min_interval_s = min_interval_s
        self.unavailable: str | None = None
        self._sockets: dict[int, _Socket] = {}
        self._own: set[int] = set()  # cookies of this process's other sockets, and of others'
        self._foreign: set[int] = set()
        self._last = -float("inf")
        self._lock = threading.Lock()

    def sample(self, force: bool = False) -> int | None:
        with self._lock:
            if self.unavailable is not None:
                return None
            now = time.monotonic()
            if force or now - self._last >= self.min_interval_s:
                self._last = now
                try:
                    self._read()
                except DiagUnavailable as e:
                    self.unavailable = str(e)
                    return None
            return sum(s.wire for s in self._sockets.values())

    def _read(self) -> None:
        sockets = self.dump()
        if any(s.bytes_sent is None for s in sockets):
            raise DiagUnavailable("tcp_info has no tcpi_bytes_sent here (Linux < 4.19)")
        mine: set[int] | None = None
        seen: set[int] = set()
        for s in sockets:
            seen.add(s.cookie)
            known = self._sockets.get(s.cookie)
            if known is not None:
                known.update(s)
                continue
            if s.inode == 0 or s.cookie in self._foreign:
                continue
            if s.cookie not in self._own:
                # A socket's owner never changes: /proc/self/fd is listed only when an unseen one
                # appears (other processes' sockets share the namespace: else at every reading).
                if mine is None:
                    mine = own_socket_inodes()
                (self._own if s.inode in mine else self._foreign).add(s.cookie)
            if s.cookie in self._own and self.matches(s):  # a sync socket may be known as one later
                self._sockets[s.cookie] = _Socket(s)
        self._own &= seen
        self._foreign &= seen
