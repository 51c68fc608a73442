"""Where an overlapped round's time goes: DiLoCo's ring on kernel-shaped links, alone and with
the WAN workload training beside it, in each region's process or in another.

    python benchmarks/ring_overlap.py [--rounds 8] [--period 2.5] [--busy 0,1,2]   (root)

Three regions in network namespaces (``netlab.py``, tc tbf at the WAN benchmark's rate on both
ends of every link, subnet 10.213.33.0/24), one process per region (``_ring_region.py``): a
DiLoCo engine built by ``create_engine`` with the TLS material and secret the control plane gives
a job's leaders, reducing the WAN workload's parameter count of float32 over its ring every
``--period`` seconds. ``--busy``: 0, the ring alone; 1, each region's process also trains the
WAN workload's model (one torch thread, as a one-CPU worker) for the whole run, as DiLoCo's
overlapped rounds run beside training; 2, the same training in a process of its own beside it
(the same CPU work, no GIL shared). Per round: the span of the region that opened it last over
the time the bytes it put on its veth need at the link rate (the figure of ``wan_job.py``'s
``round_time_over_wire_p50``). Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
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

from control_layer.worker_config import job_sync_secret  # noqa: E402
from orchestration.sync_tls import job_ca_pem, leader_credentials  # noqa: E402

PORT = 5401
BESIDE = {"0": "alone", "1": "thread", "2": "process"}  # where the training runs, if any


def run(lab: NetLab, rounds: int, period: float, busy: str, tmp: Path) -> list[dict[str, float]]:
    peers = {r: f"{lab.regions[r].ip}:{PORT}" for r in REGIONS}
    # Mutual TLS and the per-call HMAC, as the control plane sets up a job's leaders.
    secret = secrets.token_hex(16)
    sync_secret = job_sync_secret(secret, "ring-overlap")
    ca = job_ca_pem(sync_secret, "ring-overlap")
    for r in REGIONS:
        tls = leader_credentials(sync_secret, "ring-overlap", r, ca_pem=ca)
        setup = {"peers": peers, "sync": {"auth_secret": sync_secret, **tls}}
        (tmp / f"{r}.json").write_text(json.dumps(setup))
    start_at = time.time() + 20.0  # every region's server up and its trainer warm by then
    procs = {}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    for r in REGIONS:
        argv = [
            sys.executable, str(HERE / "_ring_region.py"), r, str(tmp / f"{r}.json"), repr(start_at),
            str(rounds + 1), str(period), busy, str(tmp / f"{r}.jsonl"),
        ]  # fmt: skip
        procs[r] = lab.popen(r, argv, env=env, log=tmp / f"{r}.log", cwd=REPO)
    for r, p in procs.items():
        if p.wait(timeout=120 + rounds * period * 4):
            raise RuntimeError(f"{r} failed: {(tmp / f'{r}.log').read_text()[-2000:]}")
    lines = {r: [json.loads(x) for x in (tmp / f"{r}.jsonl").read_text().splitlines()] for r in REGIONS}
    rate = LINK_MBIT * 1e6 / 8
    out = []
    for k in range(1, rounds + 1):  # round 0 opens the connections: left out
        last = max(REGIONS, key=lambda r: lines[r][k]["opened"])
        a, b = lines[last][k], lines[last][k + 1]
        span, nbytes = a["completed"] - a["opened"], b["tx_before"] - a["tx_before"]
        out.append({"round_s": span, "bytes": nbytes, "ratio": span / (nbytes / rate), "steps": a["steps"]})
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--period", type=float, default=2.5)
    ap.add_argument(
        "--busy",
        default="0,1,2",
        help="runs, in order: 0 the ring alone, 1 training in its process, 2 in another",
    )
    args = ap.parse_args()
    why = netns_available()
    if why:
        print(f"needs network namespaces: {why}", file=sys.stderr)
        return 2
    summary: dict[str, float] = {}
    print("| training | round | round s | veth tx MB | round / wire | steps trained |")
    print("|---|---|---|---|---|---|")
    with (
        tempfile.TemporaryDirectory() as tmp,
        NetLab(REGIONS, LINK_MBIT, prefix="cpnro", subnet="10.213.33") as lab,
    ):
        for busy in args.busy.split(","):
            rows = run(lab, args.rounds, args.period, busy, Path(tmp))
            key = BESIDE[busy]
            for k, r in enumerate(rows):
                print(
                    f"| {key} | {k} | {r['round_s']:.3f} | {r['bytes'] / 1e6:.2f} "
                    f"| {r['ratio']:.3f} | {r['steps']} |",
                    flush=True,
                )
            summary[f"{key}_round_time_over_wire_p50"] = statistics.median(r["ratio"] for r in rows)
            summary[f"{key}_round_s_p50"] = statistics.median(r["round_s"] for r in rows)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
