"""Per-socket TCP counters from the kernel, read over the inet_diag netlink interface (what
``ss -tie`` prints), in plain Python: one ``SOCK_DIAG_BY_FAMILY`` dump request per address family,
answers parsed with ``struct``.

gRPC's Python API exposes no file descriptors, so a process finds its own sockets by inode
(``own_socket_inodes``: the ``socket:[N]`` links under ``/proc/self/fd``) and picks them out of
the dump. The counters are the kernel's RFC 4898 ones from ``struct tcp_info``
(``include/uapi/linux/tcp.h``): payload bytes sent including retransmissions (Linux >= 4.19),
and segments sent and received of every kind (data, pure ACKs, SYN, FIN), each counted once
per MSS-sized segment even where the stack hands larger GSO buffers to the device.
"""

from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass

NETLINK_INET_DIAG = 4  # NETLINK_SOCK_DIAG
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
INET_DIAG_INFO = 2  # attribute carrying struct tcp_info
TCPI_OPT_TIMESTAMPS = 1

# Socket states with a live tcp_info: not LISTEN, nor TIME_WAIT / NEW_SYN_RECV (mini sockets
# that carry no counters).
_ESTABLISHED, _SYN_SENT, _FIN_WAIT1, _FIN_WAIT2, _CLOSE, _CLOSE_WAIT, _LAST_ACK, _CLOSING = (
    1, 2, 4, 5, 7, 8, 9, 11,
)  # fmt: skip
STATES = sum(
    1 << s
    for s in (_ESTABLISHED, _SYN_SENT, _FIN_WAIT1, _FIN_WAIT2, _CLOSE, _CLOSE_WAIT, _LAST_ACK, _CLOSING)
)

_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
# inet_diag_req_v2: family, protocol, ext, pad, states, then a zeroed inet_diag_sockid (48 bytes).
_REQ = struct.Struct("=BBBxI48x")
# inet_diag_msg: family, state, timer, retrans; sockid (ports big-endian, addresses, if, cookie);
# expires, rqueue, wqueue, uid, inode.
_MSG_HEAD = struct.Struct("=BBBB")
_PORTS = struct.Struct("!HH")
_MSG_TAIL = struct.Struct("=IIIIIIII")  # if, cookie[2], expires, rqueue, wqueue, uid, inode
_MSG_LEN = 72
_RTATTR = struct.Struct("=HH")
# Offsets in struct tcp_info.
_OPTIONS_AT = 5
_SEGS_AT, _SEGS_END = 136, 144  # tcpi_segs_out, tcpi_segs_in (Linux >= 4.2)
_RECEIVED_AT = 128  # tcpi_bytes_received
_SENT_AT, _SENT_END = 200, 216  # tcpi_bytes_sent, tcpi_bytes_retrans (Linux >= 4.19)


class DiagUnavailable(OSError):
    """The kernel does not answer inet_diag requests here (no netlink, no module, a sandbox)."""


@dataclass(frozen=True)
class TcpSocket:
    """One TCP socket's identity and counters. ``bytes_sent`` is None on kernels older than 4.19."""

    family: int
    state: int
    src: str
    sport: int
    dst: str
    dport: int
    inode: int  # 0 once the owning process closed it (the kernel may still be sending its FIN)
    cookie: int  # the kernel's id of the socket: stable for its whole life, also after close
    timestamps: bool  # TCP timestamps negotiated: 12 more header bytes on every segment
    segs_out: int  # u32 in the kernel: wraps after 2**32 segments
    segs_in: int
    bytes_received: int
    bytes_sent: int | None
    bytes_retrans: int | None

    @property
    def ipv4(self) -> bool:
        """True when its packets are IPv4 (an AF_INET6 socket with v4-mapped addresses sends IPv4)."""
        return "." in self.dst


def _address(family: int, raw: bytes) -> str:
    if family == socket.AF_INET:
        return socket.inet_ntop(socket.AF_INET, raw[:4])
    text = socket.inet_ntop(socket.AF_INET6, raw)
    return text[7:] if text.startswith("::ffff:") and "." in text else text


def parse_socket(body: bytes) -> TcpSocket | None:
    """One ``SOCK_DIAG_BY_FAMILY`` answer (without its netlink header); None without counters."""
    if len(body) < _MSG_LEN:
        return None
    family, state, _, _ = _MSG_HEAD.unpack_from(body, 0)
    sport, dport = _PORTS.unpack_from(body, 4)
    src, dst = _address(family, body[8:24]), _address(family, body[24:40])
    _, c0, c1, _, _, _, _, inode = _MSG_TAIL.unpack_from(body, 40)
    off, info = _MSG_LEN, b""
    while off + _RTATTR.size <= len(body):
        length, kind = _RTATTR.unpack_from(body, off)
        if length < _RTATTR.size:
            break
        if kind == INET_DIAG_INFO:
            info = body[off + _RTATTR.size : off + length]
        off += (length + 3) & ~3
    if len(info) < _SEGS_END:
        return None
    segs_out, segs_in = struct.unpack_from("=II", info, _SEGS_AT)
    (received,) = struct.unpack_from("=Q", info, _RECEIVED_AT)
    sent = retrans = None
    if len(info) >= _SENT_END:
        sent, retrans = struct.unpack_from("=QQ", info, _SENT_AT)
    return TcpSocket(
        family=family,
        state=state,
        src=src,
        sport=sport,
        dst=dst,
        dport=dport,
        inode=inode,
        cookie=c0 | (c1 << 32),
        timestamps=bool(info[_OPTIONS_AT] & TCPI_OPT_TIMESTAMPS),
        segs_out=segs_out,
        segs_in=segs_in,
        bytes_received=received,
        bytes_sent=sent,
        bytes_retrans=retrans,
    )


def parse_dump(data: bytes) -> tuple[list[TcpSocket], bool]:
    """The sockets in one read of a dump's answer, and whether the dump is done."""
    out: list[TcpSocket] = []
    off = 0
    while off + _NLMSGHDR.size <= len(data):
        length, kind, _, _, _ = _NLMSGHDR.unpack_from(data, off)
        if length < _NLMSGHDR.size:
            break
        if kind == NLMSG_DONE:
            return out, True
        if kind == NLMSG_ERROR:
            (errno,) = struct.unpack_from("=i", data, off + _NLMSGHDR.size)
            raise DiagUnavailable(-errno, f"inet_diag: {os.strerror(-errno)}")
        if kind == SOCK_DIAG_BY_FAMILY:
            s = parse_socket(data[off + _NLMSGHDR.size : off + length])
            if s is not None:
                out.append(s)
        off += (length + 3) & ~3
    return out, False


def dump_tcp(families: tuple[int, ...] = (socket.AF_INET, socket.AF_INET6)) -> list[TcpSocket]:
    """Every TCP socket of this network namespace with live counters. Raises ``DiagUnavailable``."""
    try:
        nl = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_INET_DIAG)
    except (OSError, AttributeError) as e:  # AttributeError: no AF_NETLINK (not Linux)
        raise DiagUnavailable(f"no inet_diag netlink socket: {e}") from None
    out: list[TcpSocket] = []
    with nl:
        nl.settimeout(2.0)
        for seq, family in enumerate(families, start=1):
            body = _REQ.pack(family, socket.IPPROTO_TCP, 1 << (INET_DIAG_INFO - 1), STATES)
            header = _NLMSGHDR.pack(
                _NLMSGHDR.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, seq, 0
            )
            try:
                nl.sendto(header + body, (0, 0))
                done = False
                while not done:
                    got, done = parse_dump(nl.recv(1 << 16))
                    out.extend(got)
            except DiagUnavailable:
                if seq == 1:
                    raise
                break  # e.g. IPv6 disabled: the IPv4 sockets stand
            except OSError as e:
                raise DiagUnavailable(f"inet_diag dump failed: {e}") from None
    return out


def own_socket_inodes(fd_dir: str = "/proc/self/fd") -> set[int]:
    """Inodes of the sockets this process holds open."""
    out: set[int] = set()
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return out
    for name in names:
        try:
            target = os.readlink(os.path.join(fd_dir, name))
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            out.add(int(target[8:-1]))
    return out
