"""The benchmark lab's links are shaped by the kernel: a bulk TCP transfer runs at the tbf rate,
the veth counters see every payload byte (plus headers), one frame per TCP segment, and the
workers' wire count from their sockets' kernel counters agrees with them."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.netlab import NetLab, netns_available

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]

RECEIVER = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 5201)); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); n = 0; t0 = None
while True:
    b = c.recv(1 << 16)
    if not b: break
    t0 = t0 or time.perf_counter(); n += len(b)
print(n, time.perf_counter() - t0, flush=True)
"""

SENDER = """
import socket, sys
c = socket.create_connection((sys.argv[1], 5201), timeout=30)
payload = b"x" * (1 << 16); left = int(sys.argv[2])
while left > 0:
    c.sendall(payload[: min(left, len(payload))]); left -= len(payload)
c.close()
"""


@pytest.fixture(scope="module")
def lab():
    why = netns_available()
    if why:
        pytest.skip(why)
    with NetLab(["a", "b"], rate_mbit=40) as lab:
        yield lab


def test_bulk_transfer_runs_at_the_shaped_rate(lab: NetLab) -> None:
    a, b = lab.regions["a"], lab.regions["b"]
    size = 6_000_000  # 1.2 s at 40 Mbit/s
    before_a, before_b = a.counters(), b.counters()
    rx = subprocess.Popen(
        b.command([sys.executable, "-c", RECEIVER, b.ip]), stdout=subprocess.PIPE, text=True
    )
    assert rx.stdout is not None and rx.stdout.readline().strip() == "ready"
    t0 = time.perf_counter()
    subprocess.run(a.command([sys.executable, "-c", SENDER, b.ip, str(size)]), check=True, timeout=60)
    got, secs = rx.stdout.readline().split()
    rx.wait(timeout=30)
    wall = time.perf_counter() - t0
    assert int(got) == size
    mbit = size * 8 / float(secs) / 1e6
    # tbf holds it to the rate (unshaped, a veth pair carries Gbit/s); a busy host may only slow it.
    assert mbit <= 1.1 * 40, f"{mbit:.1f} Mbit/s through a 40 Mbit/s link ({wall:.2f}s wall)"
    sent = a.counters()[0] - before_a[0]
    recv = b.counters()[1] - before_b[1]
    # TCP/IP headers add a few percent on top of the payload; nothing is lost between the ends.
    assert size <= sent <= 1.06 * size and size <= recv <= 1.06 * size


def test_the_root_namespace_reaches_every_region(lab: NetLab) -> None:
    import socket

    server = socket.socket()
    server.bind((lab.hub_ip, 0))
    server.listen(4)
    port = server.getsockname()[1]
    try:
        for region in lab.regions.values():
            connect = f"import socket; socket.create_connection(({lab.hub_ip!r}, {port}), timeout=5).close()"
            r = subprocess.run(
                region.command([sys.executable, "-c", connect]), capture_output=True, timeout=30
            )
            assert r.returncode == 0, r.stderr
            server.accept()[0].close()
    finally:
        server.close()


# Each end of one connection counts what its socket put on the wire (training.wan.wire_count) once
# the data has crossed, and says so to the other end before both close.
WIRE_RECEIVER = """
import socket, sys
from training.wan.wire_count import WireCounter
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 5202)); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); wire = WireCounter(lambda k: k.sport == 5202); left = int(sys.argv[2])
while left > 0: left -= len(c.recv(1 << 16))
print(wire.sample(force=True), flush=True); c.sendall(b"k"); c.recv(1); c.close()
"""

WIRE_SENDER = """
import socket, sys
from training.wan.wire_count import WireCounter
c = socket.create_connection((sys.argv[1], 5202), timeout=30); wire = WireCounter(lambda k: k.dport == 5202)
c.sendall(b"x" * int(sys.argv[2])); c.recv(1)
print(wire.sample(force=True), flush=True); c.sendall(b"d"); c.recv(1); c.close()
"""


def test_wire_counts_of_both_ends_are_what_the_veths_carried(lab: NetLab) -> None:
    # The reference is the kernel's interface counters, which share nothing with the socket
    # counters the wire count reads: every frame the two regions sent, headers and ACKs included.
    a, b = lab.regions["a"], lab.regions["b"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    size = 4_000_000
    before = a.counters()[0] + b.counters()[0]
    rx = subprocess.Popen(
        b.command([sys.executable, "-c", WIRE_RECEIVER, b.ip, str(size)]),
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert rx.stdout is not None and rx.stdout.readline().strip() == "ready"
    tx = subprocess.run(
        a.command([sys.executable, "-c", WIRE_SENDER, b.ip, str(size)]),
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert tx.returncode == 0, tx.stderr
    wire = int(tx.stdout.split()[-1]) + int(rx.stdout.readline())
    rx.wait(timeout=30)
    veth = a.counters()[0] + b.counters()[0] - before
    # Left out of the wire count: the segments after the readings ("k", "d", the closing FIN/ACKs),
    # the SYN's longer options, ARP: a few hundred bytes.
    assert size < wire <= veth <= wire + 2000, (wire, veth, veth / wire - 1)
