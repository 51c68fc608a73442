"""The raw-TCP ceiling of a ring round on kernel-shaped links: what plain sockets achieve.

    python benchmarks/tcp_ceiling.py [--mb 7.5] [--repeats 5]   (root)

Three regions in network namespaces (``netlab.py``, tc tbf at the WAN benchmark's rate on both
ends of every link, subnet 10.213.32.0/24). Each region streams ``--mb`` MB (a DiLoCo round's
bytes per region for the WAN workload, fp32 ring) to the next region in the ring over one plain
TCP connection while it receives as much from the previous one, the way a pipelined ring round
loads the links. Per repeat: the slowest region's time from start to its last byte received,
over the time its veth's tx bytes need at the link rate (the same figure as ``wan_job.py``'s
``round_time_over_wire_p50``, headers included). Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

from _wan_workload import LINK_MBIT, REGIONS  # noqa: E402
from netlab import NetLab, netns_available  # noqa: E402

PORT = 5301
# One region: listen, connect to the next, then send and receive at once; print the span.
REGION = """
import socket, sys, threading, time
me, nxt, nbytes, start_at = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((me, %d)); srv.listen(1)
out = None
while out is None:
    try:
        out = socket.create_connection((nxt, %d), timeout=30)
    except OSError:
        time.sleep(0.05)
conn, _ = srv.accept()
got = [0, 0.0]
def recv():
    while got[0] < nbytes:
        b = conn.recv(1 << 20)
        if not b: break
        got[0] += len(b)
    got[1] = time.time()
t = threading.Thread(target=recv); time.sleep(max(0.0, start_at - time.time()))
t0 = time.time(); t.start()
payload = memoryview(bytes(1 << 20)); left = nbytes
while left > 0:
    n = out.send(payload[: min(left, len(payload))]); left -= n
t.join()
print(t0, got[1], got[0], flush=True)
""" % (PORT, PORT)  # noqa: UP031 - a script's text


def one_round(lab: NetLab, nbytes: int, tmp: Path) -> dict[str, float]:
    names = list(lab.regions)
    start_at = time.time() + 1.5  # every region connected by then
    procs = {}
    for i, r in enumerate(names):
        nxt = lab.regions[names[(i + 1) % len(names)]].ip
        argv = [sys.executable, "-c", REGION, lab.regions[r].ip, nxt, str(nbytes), repr(start_at)]
        procs[r] = lab.popen(r, argv, env={**os.environ}, log=tmp / f"{r}.out")
    before = lab.counters()  # the namespaces outlive the senders: read before and after
    for p in procs.values():
        p.wait(timeout=120)
    after = lab.counters()
    spans = {}
    for r in procs:
        t0, t1, got = (float(x) for x in (tmp / f"{r}.out").read_text().split())
        if int(got) != nbytes:
            raise RuntimeError(f"{r} received {int(got)} of {nbytes} bytes")
        spans[r] = t1 - t0
    slowest = max(spans, key=lambda r: spans[r])
    sent = after[slowest][0] - before[slowest][0]
    return {
        "round_s": spans[slowest],
        "bytes": sent,
        "ratio": spans[slowest] / (sent / (LINK_MBIT * 1e6 / 8)),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=7.5)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    why = netns_available()
    if why:
        print(f"needs network namespaces: {why}", file=sys.stderr)
        return 2
    rows = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        NetLab(REGIONS, LINK_MBIT, prefix="cpntc", subnet="10.213.32") as lab,
    ):
        print(lab.describe(), flush=True)
        for _ in range(args.repeats):
            rows.append(one_round(lab, int(args.mb * 1e6), Path(tmp)))
    print("| repeat | round s | veth tx MB | round / wire |")
    print("|---|---|---|---|")
    for i, r in enumerate(rows):
        print(f"| {i} | {r['round_s']:.3f} | {r['bytes'] / 1e6:.2f} | {r['ratio']:.3f} |")
    summary = {
        "tcp_round_time_over_wire_p50": statistics.median(r["ratio"] for r in rows),
        "tcp_round_s_p50": statistics.median(r["round_s"] for r in rows),
        "mb_per_region": args.mb,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
