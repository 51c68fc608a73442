"""The inet_diag reader against real TCP connections on loopback: what one end sent, the kernel's
counters for both ends say, byte for byte."""

from __future__ import annotations

import re
import shutil
import socket
import struct
import subprocess
import threading
import time

import pytest

from training.wan.inet_diag import (
    NLMSG_ERROR,
    DiagUnavailable,
    TcpSocket,
    dump_tcp,
    own_socket_inodes,
    parse_dump,
)


def _pair() -> tuple[socket.socket, socket.socket, socket.socket]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    return server, client, accepted


def _send(src: socket.socket, dst: socket.socket, n: int) -> None:
    got = bytearray()

    def read() -> None:
        while len(got) < n:
            got.extend(dst.recv(1 << 20))

    t = threading.Thread(target=read)
    t.start()
    src.sendall(b"x" * n)
    t.join(30)
    assert len(got) == n


def _find(sockets: list[TcpSocket], local: tuple[str, int]) -> TcpSocket:
    (s,) = [s for s in sockets if (s.src, s.sport) == local]
    return s


def test_counters_of_a_loopback_connection_are_the_bytes_it_carried() -> None:
    server, client, accepted = _pair()
    try:
        n = 3_000_000
        _send(client, accepted, n)
        _send(accepted, client, 1234)
        sockets = dump_tcp()
        c = _find(sockets, client.getsockname())
        a = next(s for s in sockets if (s.dst, s.dport) == client.getsockname())
        assert (c.dst, c.dport) == server.getsockname() and c.sport == client.getsockname()[1]
        # Sent bytes count retransmissions too (a tail-loss probe can fire on a loaded machine, even
        # on loopback); received bytes count each byte once.
        assert c.bytes_sent == n + c.bytes_retrans and c.bytes_received == 1234
        assert a.bytes_received == n and a.bytes_sent == 1234 + a.bytes_retrans
        assert c.state == a.state == 1  # ESTABLISHED
        # Segments of at most one loopback MSS (65,483 bytes) each way; the receiver's count can
        # trail the sender's while segments wait in its backlog.
        assert n // 65483 <= a.segs_in <= c.segs_out <= n // 1000 and a.segs_out <= c.segs_in
        assert c.timestamps and a.timestamps and c.ipv4
        assert {c.inode, a.inode} <= own_socket_inodes()
        assert c.cookie != a.cookie
        # The cookie follows a socket: the next reading finds the same one, with grown counters.
        _send(client, accepted, 1000)
        again = next(s for s in dump_tcp() if s.cookie == c.cookie)
        assert again.bytes_sent - again.bytes_retrans == n + 1000 and again.segs_out > c.segs_out
    finally:
        for s in (client, accepted, server):
            s.close()


@pytest.mark.skipif(shutil.which("ss") is None, reason="iproute2's ss is not installed")
def test_the_reader_agrees_with_iproute2s_ss() -> None:
    # ss parses the same kernel answers with its own code: the two must read the same counters.
    server, client, accepted = _pair()
    try:
        _send(client, accepted, 500_000)
        _send(accepted, client, 777)
        time.sleep(0.3)  # delayed ACKs out: the counters hold still while both read them
        port = client.getsockname()[1]
        out = subprocess.run(
            ["ss", "-tinH", "src", f"127.0.0.1:{port}"], capture_output=True, text=True, check=True
        ).stdout
        theirs = {
            k: int(v) for k, v in re.findall(r"\b(bytes_sent|bytes_received|segs_out|segs_in):(\d+)", out)
        }
        mine = _find(dump_tcp(), client.getsockname())
        assert theirs == {
            "bytes_sent": mine.bytes_sent,
            "bytes_received": mine.bytes_received,
            "segs_out": mine.segs_out,
            "segs_in": mine.segs_in,
        }
    finally:
        for s in (client, accepted, server):
            s.close()


def test_a_closed_socket_leaves_this_process() -> None:
    server, client, accepted = _pair()
    inode = next(s.inode for s in dump_tcp() if (s.src, s.sport) == client.getsockname())
    client.close()
    accepted.close()
    server.close()
    assert inode not in own_socket_inodes()


def test_a_kernel_error_answer_means_unavailable() -> None:
    error = struct.pack("=IHHII", 36, NLMSG_ERROR, 0, 1, 0) + struct.pack("=i", -2) + bytes(16)
    with pytest.raises(DiagUnavailable, match="No such file"):
        parse_dump(error)


def test_truncated_answers_are_skipped() -> None:
    assert parse_dump(b"") == ([], False)
    assert parse_dump(b"\x00" * 10) == ([], False)
    # A socket message too short to hold an inet_diag_msg: no socket, no crash.
    short = struct.pack("=IHHII", 24, 20, 0, 1, 0) + bytes(8)
    assert parse_dump(short) == ([], False)
