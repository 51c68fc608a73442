"""Link measurement on kernel-shaped links: what agents' probes measure against the tbf rate.

    python benchmarks/link_probe.py [--rates 25,50,100,200]   # needs root (ip netns)

Per rate: two network namespaces joined by links shaped with tc tbf at that rate on both ends
(benchmarks/netlab.py), a control plane in the root namespace with its default probe settings,
and one real agent (``python -m agent``) in each namespace. The control plane orders the probes
it orders at registration (both directions); each agent echoes and streams its bulk transfer to
the other over the shaped link, and the result comes back over the agent stream. The figures are
read where a user would read them: ``GET /v1/links/probes`` and ``GET /v1/links``.

tbf counts whole Ethernet frames, so the payload a TCP stream can carry is below the shaped rate
(1448 payload bytes per 1514-byte frame with timestamps: 95.6 %), before gRPC's own framing.
Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._host import patience  # noqa: E402
from benchmarks.netlab import NetLab, netns_available  # noqa: E402
from orchestration.settings import Settings  # noqa: E402

SUBNET = "10.213.11"
REGIONS = ("eu-west", "us-east")
TOLERANCE = 0.15


def _agent_argv(
    lab: NetLab, region: str, grpc_port: int, token: str, workdir: Path, measure_profile: bool
) -> list[str]:
    r = lab.regions[region]
    return [
        sys.executable, "-m", "agent", "--server", f"{lab.hub_ip}:{grpc_port}", "--token", token,
        "--region", region, "--cluster", f"{region}-1", "--provider", "lab", "--devices", "cpu:1",
        "--price-per-device-hour", "1.0", "--advertise-host", r.ip, "--sync-ports", "29600-29609",
        "--work-dir", str(workdir / region),
        "--measure-profile" if measure_profile else "--no-measure-profile",
    ]  # fmt: skip


def _wait(client: httpx.Client, n: int, timeout_s: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        probes = client.get("/v1/links/probes").raise_for_status().json()
        done = [p for p in probes if p["status"] != "pending"]
        if len(done) >= n:
            return done
        time.sleep(0.5)
    raise TimeoutError(f"fewer than {n} probes finished within {timeout_s:.0f}s")


def measure(rate_mbit: float, index: int, timeout_s: float, measure_profile: bool = True) -> dict[str, Any]:
    """One rate's probes. ``measure_profile=False`` skips the agents' reference worker step at
    start-up (the probes do not depend on it; it only delays registration)."""
    from service_layer.server import start_server_in_thread

    workdir = Path(tempfile.mkdtemp(prefix="cpn-link-probe-"))
    admin_key = "cpn_admin_" + secrets.token_urlsafe(24)
    with NetLab(list(REGIONS), rate_mbit=rate_mbit, subnet=SUBNET, prefix=f"cpnlk{index}") as lab:
        settings = Settings(
            data_dir=workdir,
            http_port=0,
            grpc_host=lab.hub_ip,
            grpc_port=0,
            heartbeat_interval_s=1.0,
            admin_api_key=admin_key,
            link_probe_tick_s=0.5,
        )
        handle = start_server_in_thread(settings)
        procs = []
        try:
            client = httpx.Client(
                base_url=handle.http_url, headers={"Authorization": f"Bearer {admin_key}"}, timeout=30
            )
            token = (
                client.post("/v1/tokens", json={"provider": "lab", "max_uses": 2}).raise_for_status().json()
            )["token"]
            for region in REGIONS:
                (workdir / region).mkdir()
                procs.append(
                    lab.popen(
                        region,
                        _agent_argv(lab, region, handle.grpc_port, token, workdir, measure_profile),
                        log=workdir / f"{region}.log",
                    )
                )
            probes = _wait(client, 2, timeout_s)
            links = client.get("/v1/links").raise_for_status().json()
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(20)
                except Exception:
                    p.kill()
            handle.stop()
    failed = [p for p in probes if p["status"] != "ok"]
    if failed:
        raise RuntimeError(f"probes failed: {[p['error'] for p in failed]} (logs in {workdir})")
    return {"rate_mbit": rate_mbit, "probes": probes, "links": links}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="25,50,100,200", help="tbf rates in Mbit/s, comma-separated")
    ap.add_argument(
        "--timeout", type=float, default=120.0, help="Seconds to wait for a rate's probes (× the host's pace)"
    )
    args = ap.parse_args()
    why = netns_available()
    if why:
        sys.exit(f"link_probe: cannot build the lab: {why}")
    rates = [float(r) for r in args.rates.split(",")]
    rows = []
    print(
        f"{'shaped Mbit/s':>13} {'direction':<18} {'measured Mbit/s':>15} {'ratio':>6} {'rtt ms':>7} "
        f"{'probe s':>7} {'link source':<11}"
    )
    for i, rate in enumerate(rates):
        result = measure(rate, i, patience(args.timeout))
        shown = {(ln["src"], ln["dst"]): ln for ln in result["links"]}
        for p in sorted(result["probes"], key=lambda p: p["src_region"]):
            mbit = p["bandwidth_gbps"] * 1000
            link = shown.get((p["src_region"], p["dst_region"]), {})
            row = {
                "rate_mbit": rate,
                "src": p["src_region"],
                "dst": p["dst_region"],
                "measured_mbit": round(mbit, 2),
                "ratio": round(mbit / rate, 4),
                "rtt_ms": round(p["rtt_ms"], 3),
                "probe_s": round(p["duration_s"], 3),
                "source": link.get("source"),
            }
            rows.append(row)
            print(
                f"{rate:>13g} {row['src'] + '->' + row['dst']:<18} {mbit:>15.2f} {row['ratio']:>6.3f} "
                f"{row['rtt_ms']:>7.3f} {row['probe_s']:>7.3f} {row['source'] or '-':<11}",
                flush=True,
            )
    ratios = [r["ratio"] for r in rows]
    worst = max(abs(1 - x) for x in ratios)
    print(
        json.dumps(
            {
                "rates_mbit": rates,
                "probes": len(rows),
                "ratio_min": min(ratios),
                "ratio_median": statistics.median(ratios),
                "ratio_max": max(ratios),
                "worst_rel_err": round(worst, 4),
                "within_15pct": worst <= TOLERANCE,
                "all_links_measured": all(r["source"] == "measured" for r in rows),
            }
        )
    )


if __name__ == "__main__":
    main()
