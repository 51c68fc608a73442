"""The wire count of a process's sockets: headers per segment, what it picks, what it keeps after a
close, and what it says where the kernel cannot answer. (Against the kernel's interface counters,
on kernel-shaped links: ``tests/benchmarks/test_netlab.py``.)"""

from __future__ import annotations

import dataclasses
import socket
import threading
from pathlib import Path
from typing import Any

from tests.training.sync_launch import region_configs, run_regions
from training.wan.inet_diag import DiagUnavailable, TcpSocket, dump_tcp
from training.wan.wire_count import WireCounter, header_bytes


def test_header_bytes_per_segment() -> None:
    # Ethernet 14 + IPv4 20 + TCP 20 + timestamps 12; IPv6 is 20 bytes longer.
    assert header_bytes(ipv4=True, timestamps=True) == 66
    assert header_bytes(ipv4=True, timestamps=False) == 54
    assert header_bytes(ipv4=False, timestamps=True) == 86


class Conn:
    """A loopback connection that carries ``n`` bytes one way on ``send``."""

    def __init__(self) -> None:
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(1)
        self.port = self.server.getsockname()[1]
        self.client = socket.create_connection(("127.0.0.1", self.port))
        self.accepted, _ = self.server.accept()

    def send(self, n: int) -> None:
        got = 0

        def read() -> None:
            nonlocal got
            while got < n:
                got += len(self.accepted.recv(1 << 20))

        t = threading.Thread(target=read)
        t.start()
        self.client.sendall(b"x" * n)
        t.join(30)

    def close(self) -> None:
        for s in (self.client, self.accepted, self.server):
            s.close()


def test_counts_the_picked_connection_only_and_keeps_it_after_close() -> None:
    picked, other = Conn(), Conn()
    try:
        counter = WireCounter(lambda s: picked.port in (s.sport, s.dport), min_interval_s=60)
        start = counter.sample(force=True)
        assert start is not None and 0 < start < 1000  # the handshake's segments only
        picked.send(2_000_000)
        other.send(2_000_000)
        after = counter.sample(force=True)
        assert after is not None and 2_000_000 < after - start < 2_100_000
        assert counter.sample() == after  # within min_interval_s: the last reading, no new one
        picked.send(10_000)
        assert counter.sample() == after
        grown = counter.sample(force=True)
        assert grown is not None and grown >= after + 10_000
    finally:
        picked.close()
        other.close()
    # Closed: the sockets are gone from this process, their last readings stand.
    final = counter.sample(force=True)
    assert final is not None and final >= grown


def test_fd_table_listed_only_for_unseen_sockets(monkeypatch: Any) -> None:
    # Another process's socket (an inode this one does not hold) shares the namespace: it is looked
    # up once, not at every reading; an own socket that matches only later is then counted.
    import training.wan.wire_count as wc

    listings = 0
    real_listing = wc.own_socket_inodes

    def counted() -> set[int]:
        nonlocal listings
        listings += 1
        return real_listing()

    monkeypatch.setattr(wc, "own_socket_inodes", counted)
    conn = Conn()
    try:
        (real,) = [s for s in dump_tcp() if (s.src, s.sport) == conn.client.getsockname()]
        foreign = dataclasses.replace(real, cookie=real.cookie + 1, inode=(1 << 62))  # no fd holds it
        picked = False
        counter = WireCounter(lambda s: picked, dump=lambda: [real, foreign])
        assert counter.sample(force=True) == 0 and listings == 1
        assert counter.sample(force=True) == 0 and listings == 1
        picked = True  # e.g. the peer's client registered after its connection opened
        assert counter.sample(force=True) == (real.bytes_sent or 0) + real.segs_out * 66
        assert listings == 1
    finally:
        conn.close()


def test_segment_counts_past_the_kernels_32_bit_wrap() -> None:
    conn = Conn()
    try:
        (real,) = [s for s in dump_tcp() if (s.src, s.sport) == conn.client.getsockname()]
        readings = [
            dataclasses.replace(real, segs_out=(1 << 32) - 10, bytes_sent=100),
            dataclasses.replace(real, segs_out=5, bytes_sent=200),
        ]
        counter = WireCounter(lambda s: True, dump=lambda: [readings.pop(0)])
        assert counter.sample(force=True) == 100 + ((1 << 32) - 10) * 66
        assert counter.sample(force=True) == 200 + ((1 << 32) + 5) * 66
    finally:
        conn.close()


def test_unavailable_is_none_not_zero() -> None:
    def no_diag() -> list[TcpSocket]:
        raise DiagUnavailable("inet_diag: Protocol not supported")

    counter = WireCounter(lambda s: True, dump=no_diag)
    assert counter.sample(force=True) is None


def test_a_kernel_without_bytes_sent_is_unavailable() -> None:
    conn = Conn()
    try:
        (real,) = [s for s in dump_tcp() if (s.src, s.sport) == conn.client.getsockname()]
        old = dataclasses.replace(real, bytes_sent=None, bytes_retrans=None)  # Linux < 4.19
        counter = WireCounter(lambda s: True, dump=lambda: [old])
        assert counter.sample(force=True) is None and "4.19" in (counter.unavailable or "")
    finally:
        conn.close()


def test_workers_report_their_wire_bytes_beside_the_grpc_bytes(tmp_path: Path) -> None:
    # Real worker processes in two regions on loopback: every step's metrics carry the running
    # wire total, and the result the run's totals after the final exchange and leaving the peers.
    base = {
        "job_id": "wire",
        "model": {"n_layers": 1, "d_model": 16, "n_heads": 2, "vocab": 16, "seq_len": 16},
        "data": {"kind": "synthetic-markov", "seed": 1},
        "training": {"steps": 12, "local_batch": 4, "lr": 3e-3, "warmup": 2, "seed": 7},
    }
    sync = {"mode": "diloco", "every": 4, "balance": False}  # both regions run the job's 12 steps
    procs = run_regions(region_configs(base, ["eu-west", "us-east"], sync, tmp_path), tmp_path, timeout=180)
    for p in procs.values():
        res = p.result()
        assert res is not None and res["steps"] == 12, p.output()[-3000:]
        totals = [m["sync"]["wire_bytes_sent_total"] for m in p.metrics() if "sync" in m]
        assert totals and totals == sorted(totals)  # a running total: it never falls
        grpc_bytes = sum(n for m in p.metrics() if "sync" in m for n in m["sync"]["bytes_sent"].values())
        assert 0 < grpc_bytes <= res["wan_bytes_sent"]
        # On the wire: gRPC's messages plus HTTP/2 framing and headers, TCP/IP headers and ACKs.
        assert res["wan_bytes_sent"] < res["wan_wire_bytes_sent"] < 2 * res["wan_bytes_sent"] + 200_000
        assert totals[-1] <= res["wan_wire_bytes_sent"]
