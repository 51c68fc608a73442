"""Do quotes come true? Estimated vs actual time and cost on a real local fleet, before and after calibration.

    python benchmarks/quote_accuracy.py [--steps-scale 1.0] [--job-timeout 150] [--busy 0]

Starts a control plane (SQLite, in-process bus) and the three `cpn demo` agents (three regions,
two CPU slots each, declared links), waits for the link probes that registration orders (every
region pair measured), then runs 12 jobs in order: four model sizes, 1-3 regions,
sync modes sync / diloco / gossip, different step counts. The first six are all quoted up front,
on a fresh control plane, so they are priced with nothing but what the agents measured at
registration; each of the last six is quoted just before it runs, with the calibration the
finished jobs before it produced. Per job: estimate, actual (the billed span and the ledger) and
relative error, for time and cost. Prints a table, then one final JSON line with the host's speed
(``_host.host_loop_s``, measured before the fleet starts). ``--busy N``: N CPU-bound loops run
beside the fleet from before the agents register until the last job ends, as other tenants' work on
a shared host: the agents' measurements, the calibration and the quotes all meet it.
"""

from __future__ import annotations

import argparse
import json
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

import httpx  # noqa: E402
from _host import busy_loops, host_loop_s, patience  # noqa: E402

from contracts.states import JOB_TERMINAL  # noqa: E402
from control_layer.calibration import quantile  # noqa: E402
from orchestration.settings import Settings  # noqa: E402
from service_layer.cli.demo import DEMO_AGENTS, DEMO_LINKS, wait_for_clusters  # noqa: E402
from service_layer.cli.local_fleet import enroll, start_agents, stop_agents  # noqa: E402

# name: (n_layers, d_model, n_heads, vocab, seq_len)
SIZES = {
    "xs": (2, 64, 4, 64, 64),
    "s": (2, 128, 4, 256, 64),
    "m": (4, 128, 4, 256, 128),
    "l": (4, 256, 8, 512, 128),
}
REGION_SETS = {1: ["eu-north"], 2: ["eu-west", "eu-north"], 3: ["eu-west", "eu-north", "us-east"]}
# (size, regions, sync mode, steps): the second half repeats the first half's mix in other shapes.
JOBS: list[tuple[str, int, str, int]] = [
    ("xs", 1, "sync", 40),
    ("s", 2, "diloco", 40),
    ("m", 3, "gossip", 30),
    ("l", 1, "sync", 20),
    ("s", 3, "sync", 20),
    ("m", 2, "gossip", 30),
    ("xs", 3, "diloco", 30),
    ("l", 2, "sync", 20),
    ("m", 1, "sync", 40),
    ("s", 2, "gossip", 50),
    ("xs", 2, "sync", 60),
    ("l", 3, "diloco", 20),
]


def job_spec(i: int, size: str, regions: int, mode: str, steps: int) -> dict[str, Any]:
    n_layers, d_model, n_heads, vocab, seq_len = SIZES[size]
    dp = 2 * regions  # two CPU slots per region: the placement has to span exactly these regions
    sync: dict[str, Any] = {"mode": mode}
    if mode in ("diloco", "gossip"):
        sync["every"] = 10
    if mode == "diloco":
        sync["compression"] = "int8"
    return {
        "name": f"qa-{i:02d}-{size}-{mode}",
        "model": {
            "n_layers": n_layers,
            "d_model": d_model,
            "n_heads": n_heads,
            "vocab": vocab,
            "seq_len": seq_len,
        },
        "data": {"kind": "synthetic-markov", "seed": i},
        "training": {"steps": steps, "global_batch_tokens": dp * 2 * seq_len, "lr": 3e-3, "seed": i},
        "parallelism": {"dp": dp, "tp": 1, "pp": 1, "zero": 0},
        "sync": sync,
        "qos": {"max_hours": 1, "max_cost": 10, "objective": "cost", "regions": REGION_SETS[regions]},
    }


def wait_for_measured_links(client: httpx.Client, n_regions: int, timeout_s: float | None = None) -> int:
    """Until the probes the control plane orders at registration have measured every ordered
    region pair (they run one pair at a time), or the ceiling, ``patience(120)``: a first-pass
    quote rests on everything that registration measures, the links included. Returns the
    measured links found (the caller prints them)."""
    want = n_regions * (n_regions - 1)
    timeout_s = timeout_s if timeout_s is not None else patience(120.0)
    deadline = time.monotonic() + timeout_s
    while True:
        links = client.get("/v1/links").raise_for_status().json()
        measured = sum(ln["source"] == "measured" for ln in links)
        if measured >= want or time.monotonic() > deadline:
            return measured
        time.sleep(0.5)


def quote(client: httpx.Client, spec: dict[str, Any]) -> dict[str, Any]:
    q = client.post("/v1/quotes", json=spec).raise_for_status().json()
    return {"quote_id": q["id"], "option": q["options"][0]}


def run(client: httpx.Client, quoted: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    body = {"quote_id": quoted["quote_id"], "option_id": quoted["option"]["id"]}
    job_id = client.post("/v1/jobs", json=body).raise_for_status().json()["id"]
    deadline = time.monotonic() + timeout_s
    while True:
        job = client.get(f"/v1/jobs/{job_id}").raise_for_status().json()
        if job["status"] in JOB_TERMINAL:
            return job
        if time.monotonic() > deadline:
            client.post(f"/v1/jobs/{job_id}/cancel", json={"reason": "benchmark timeout"})
            raise RuntimeError(f"job {job_id} still {job['status']} after {timeout_s:.0f}s")
        time.sleep(0.25)


def row(i: int, phase: str, shape: tuple[str, int, str, int], job: dict[str, Any]) -> dict[str, Any]:
    acc = job.get("accuracy") or {}
    est, act, err = acc.get("estimated") or {}, acc.get("actual") or {}, acc.get("error") or {}
    return {
        "job": i,
        "phase": phase,
        "size": shape[0],
        "regions": shape[1],
        "mode": shape[2],
        "steps": shape[3],
        "status": job["status"],
        "est_s": est.get("duration_s"),
        "actual_s": act.get("duration_s"),
        "time_err": err.get("time"),
        "est_cost": est.get("cost"),
        "actual_cost": act.get("cost"),
        "cost_err": err.get("cost"),
        "interval_s": [
            (est.get("interval") or {}).get("duration_s_low"),
            (est.get("interval") or {}).get("duration_s_high"),
        ],
    }


def _abs(rows: list[dict[str, Any]], key: str) -> list[float]:
    return [abs(r[key]) for r in rows if r[key] is not None]


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps-scale", type=float, default=1.0, help="Multiply every job's steps")
    ap.add_argument("--job-timeout", type=float, default=150.0)
    ap.add_argument("--records", type=Path, help="Write every job's estimate-vs-actual record (JSON) here")
    ap.add_argument("--busy", type=int, default=0, help="CPU-bound loops beside the fleet for the whole run")
    args = ap.parse_args()
    loop_s = host_loop_s()
    with busy_loops(args.busy):
        rows = _run_jobs(args)
    _report(rows, args.busy, loop_s)


def _run_jobs(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The control plane, the agents and the twelve jobs; per job its row."""

    from service_layer.server import start_server_in_thread

    workdir = Path(tempfile.mkdtemp(prefix="cpn-quote-accuracy-"))
    admin_key = "cpn_admin_" + secrets.token_urlsafe(24)
    # Heartbeats at the server's default interval: on a host crowded by other work a 1 s interval
    # let agents be declared lost mid-job.
    settings = Settings(data_dir=workdir, http_port=0, grpc_port=0, admin_api_key=admin_key)
    handle = start_server_in_thread(settings)
    agents: list[subprocess.Popen[bytes]] = []
    rows: list[dict[str, Any]] = []
    records: list[dict[str, Any]] = []
    shapes = [(s, r, m, max(2, round(n * args.steps_scale))) for s, r, m, n in JOBS]
    half = len(shapes) // 2
    try:
        client = httpx.Client(
            base_url=handle.http_url, headers={"Authorization": f"Bearer {admin_key}"}, timeout=60
        )
        agents = start_agents(DEMO_AGENTS, handle.grpc_target, enroll(client, DEMO_AGENTS, "bench"), workdir)
        wait_for_clusters(client, len(DEMO_AGENTS), timeout_s=patience(300.0))
        for link in DEMO_LINKS:
            client.put("/v1/links", json=link).raise_for_status()
        measured = wait_for_measured_links(client, len(DEMO_AGENTS))
        print(f"links measured at registration: {measured}", file=sys.stderr, flush=True)
        # First pass: every quote made before any job has run.
        first = [quote(client, job_spec(i, *shape)) for i, shape in enumerate(shapes[:half])]
        for i, (shape, quoted) in enumerate(zip(shapes[:half], first, strict=True)):
            job = run(client, quoted, args.job_timeout)
            rows.append(row(i, "first", shape, job))
            records.append({"job": i, "option": quoted["option"], "accuracy": job.get("accuracy")})
            if args.records:  # as it goes: a run cut short still leaves its residuals
                args.records.write_text(json.dumps({"jobs": records}, indent=1))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        for i, shape in enumerate(shapes[half:], start=half):
            quoted = quote(client, job_spec(i, *shape))
            job = run(client, quoted, args.job_timeout)
            rows.append(row(i, "calibrated", shape, job))
            records.append({"job": i, "option": quoted["option"], "accuracy": job.get("accuracy")})
            if args.records:  # as it goes: a run cut short still leaves its residuals
                args.records.write_text(json.dumps({"jobs": records}, indent=1))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        table = client.get("/v1/calibration", params={"limit": 1}).raise_for_status().json()
        links = client.get("/v1/links").raise_for_status().json()
    finally:
        stop_agents(agents)
        handle.stop()
    print("calibration:", json.dumps(table["calibration"]))
    if args.records:
        args.records.write_text(json.dumps({"jobs": records, "calibration": table, "links": links}, indent=1))

    return rows


def _report(rows: list[dict[str, Any]], busy: int, loop_s: float) -> None:
    header = f"{'#':>2} {'phase':<10} {'size':<4} {'reg':>3} {'mode':<6} {'steps':>5} {'status':<9} "
    header += f"{'est s':>8} {'act s':>8} {'t err':>7} {'est $':>9} {'act $':>9} {'$ err':>7}"
    print(header)
    for r in rows:
        print(
            f"{r['job']:>2} {r['phase']:<10} {r['size']:<4} {r['regions']:>3} {r['mode']:<6} {r['steps']:>5} "
            f"{r['status']:<9} {_fmt(r['est_s'], '8.2f')} {_fmt(r['actual_s'], '8.2f')} "
            f"{_fmt(r['time_err'], '+7.2f')} {_fmt(r['est_cost'], '9.6f')} {_fmt(r['actual_cost'], '9.6f')} "
            f"{_fmt(r['cost_err'], '+7.2f')}"
        )
    first_rows = [r for r in rows if r["phase"] == "first"]
    cal_rows = [r for r in rows if r["phase"] == "calibrated"]

    def stat(rs: list[dict[str, Any]], key: str, q: float) -> float | None:
        xs = _abs(rs, key)
        return round(quantile(xs, q), 4) if xs else None

    print(
        json.dumps(
            {
                "first_pass_time_err_p50": stat(first_rows, "time_err", 0.5),
                "first_pass_time_err_max": round(max(_abs(first_rows, "time_err")), 4)
                if _abs(first_rows, "time_err")
                else None,
                "calibrated_time_err_p50": stat(cal_rows, "time_err", 0.5),
                "calibrated_time_err_p90": stat(cal_rows, "time_err", 0.9),
                "calibrated_cost_err_p50": stat(cal_rows, "cost_err", 0.5),
                "calibrated_cost_err_p90": stat(cal_rows, "cost_err", 0.9),
                "jobs": len(rows),
                "succeeded": sum(r["status"] == "succeeded" for r in rows),
                "busy_loops": busy,
                "host_loop_s": round(loop_s, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
