"""Real jobs on kernel-shaped WAN links: what a job submitted over REST gets, mode by mode.

    python benchmarks/wan_job.py [--steps 500] [--quick] [--only MODE...] [--no-fault]

Network: 3 regions in network namespaces (``benchmarks/netlab.py``, subnet 10.213.31.0/24: veth
pairs through a bridge, tc tbf 100 Mbit/s on both ends of every link). Latency is NOT emulated
(netem is absent here), so every link is bandwidth-bound only.

Fleet: one real ``cpn agent`` per namespace (one CPU slot, advertising its namespace address,
sync ports 29800-29849) plus a dearer standby node in ``us-east`` (ports 29850-29899) that only
the fault run's replacement takes, against one ``cpn server`` process on PostgreSQL + Redis (a
fresh database) that listens for agents on the bridge's root-side address. The agents measure
the links themselves (4 MiB probes, before the first job); declared links carry the egress price.

Jobs: the workload of ``benchmarks/sync_quality.py`` (``_wan_workload.py``: 4-layer GPT of 1.34M
parameters, 8 x 128 tokens per region per step), three replicas pinned (one per region), each
mode submitted over REST and placed, configured and checkpointed by the control plane.

Figures, read back from the API (job detail, result, metrics series) and the veth counters:
- utilisation per region: the region's own work (data + forward/backward + optimizer) / train-loop
  wall time, without the first step (which waits for every peer to be up); the lowest region.
  The stricter forward/backward-only share is shown too;
- WAN bytes: inter-region bytes from the veth counters (every region's tx minus what the bridge
  passes to the control plane) against the workers' wire count (the tasks'
  ``wan_wire_bytes_sent``: their sync sockets' kernel TCP counters with per-segment headers);
  their gRPC message count (``wan_bytes_sent``, what egress is priced on) is shown beside;
- held-out loss of the final model at equal tokens (16 x 64 sequences no training stream sees);
- job wall time (``actual_duration_s``) against the slowest region's train loop;
- round time over wire (``_round_wire.py``): per exchange round, the time the region that opened
  it last took to complete it, over the time the bytes it put on its veth within that span need
  at the link rate (the veth tx counters sampled every 5 ms, the rounds' spans from the workers'
  results); the median round per mode (``round_time_over_wire_p50``; 1.0 is the wire's speed).
Rows: fixed settings (each sets H and an uncompressed payload), and "diloco planned", whose spec
names the mode alone: the planner chooses H and the codec (and overlap, fragments, checkpoints
and ring order) from the links the agents measured; the table shows what it chose, read back
from the job's option.
Fault run: diloco H=20, ``kill -9`` of the us-east agent and its workers mid-job; the control
plane re-places that region alone (on the standby) and the job goes on.
Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402
from _host import patience  # noqa: E402
from _round_wire import TxSampler, round_figures, summary  # noqa: E402
from _wan_workload import (  # noqa: E402
    BATCH,
    DATA,
    LINK_MBIT,
    LR,
    MODEL,
    QUICK_BATCH,
    QUICK_MODEL,
    REGIONS,
    SEED,
    WARMUP,
)
from control_plane import Database, Replica, admin_client, server_env  # noqa: E402
from netlab import NetLab, netns_available  # noqa: E402
from sync_quality import final_state, held_out_loss  # noqa: E402

from service_layer.cli.demo import wait_for_clusters  # noqa: E402
from service_layer.cli.local_fleet import LocalAgent, enroll, kill_agent, stop_agents  # noqa: E402

SUBNET, PREFIX, PORTS, STANDBY_PORTS = "10.213.31", "cpnwj", (29800, 29849), (29850, 29899)
TERMINAL = ("succeeded", "failed", "cancelled")
PRICES = {"ap-south": 1.0, "eu-west": 1.1, "us-east": 1.2}
STANDBY = LocalAgent("us-east", "us-east-standby", "standby", 5.0, devices="cpu:1")
VICTIM = "us-east"
# The fixed rows set H and the codec themselves (uncompressed: fp32 payloads).
FAULT_SYNC = {"mode": "diloco", "every": 20, "compression": "none"}


def modes() -> list[tuple[str, dict[str, Any]]]:
    """(name, the spec's sync section). Everything else (overlap, fragments, checkpoint interval,
    ring order, balanced rounds for local SGD and DiLoCo) is what the control plane gives the
    option's workers."""
    return [
        ("sync", {"mode": "sync", "every": 1, "compression": "none"}),
        ("local_sgd H=20", {"mode": "local_sgd", "every": 20, "compression": "none"}),
        ("diloco H=20", {"mode": "diloco", "every": 20, "compression": "none"}),
        ("diloco H=100", {"mode": "diloco", "every": 100, "compression": "none"}),
        ("gossip", {"mode": "gossip", "every": 10, "compression": "none"}),
        # The mode alone: H, the codec, overlap, delay, fragments, checkpoints and ring order are
        # the planner's (``planner/sync_choice.py``); the table shows the H and codec it chose.
        ("diloco planned", {"mode": "diloco"}),
    ]


def job_spec(name: str, model: dict, batch: int, steps: int, sync: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "model": {"family": "gpt", **model},
        "data": DATA,
        "training": {
            "steps": steps,
            "global_batch_tokens": len(REGIONS) * batch * model["seq_len"],
            "micro_batch_size": batch,
            "lr": LR,
            "warmup_steps": min(WARMUP, steps),
            "seed": SEED,
        },
        "parallelism": {"dp": len(REGIONS), "tp": 1, "pp": 1, "zero": 0},
        "sync": sync,
        "qos": {"max_hours": 4, "objective": "cost"},
    }


class Fleet:
    """The control plane and the agents, in the lab's namespaces."""

    def __init__(self, lab: NetLab, root: Path) -> None:
        self.lab, self.root = lab, root
        self.db = Database()
        self.admin_key = "cpn_admin_" + secrets.token_urlsafe(16)
        env = server_env(
            self.db, root, self.admin_key,
            CPN_GRPC_HOST=lab.hub_ip, CPN_HEARTBEAT_INTERVAL_S="1", CPN_HEARTBEAT_MISSES="3",
            # one probe of each link before the first job, none during the runs
            CPN_LINK_PROBE_INTERVAL_S="86400",
        )  # fmt: skip
        self.server = Replica("wan-job", env, root)
        self.agents: dict[str, Any] = {}
        self.client: httpx.Client | None = None

    def start(self) -> httpx.Client:
        self.server.start()
        self.client = admin_client(self.server, self.admin_key)
        specs = [LocalAgent(r, f"{r}-c0", f"p-{r}", PRICES[r], devices="cpu:1") for r in REGIONS]
        tokens = enroll(self.client, [*specs, STANDBY], note="wan-job")
        for s in specs:
            self.agents[s.region] = self._agent(s, tokens[s.provider], PORTS)
        self.agents["standby"] = self._agent(STANDBY, tokens[STANDBY.provider], STANDBY_PORTS)
        wait_for_clusters(self.client, len(REGIONS) + 1, timeout_s=patience(300.0))
        for i, a in enumerate(REGIONS):  # the egress price; bandwidth and latency the agents measure
            for b in REGIONS[i + 1 :]:
                link = {"src": a, "dst": b, "bandwidth_gbps": LINK_MBIT / 1e3, "latency_ms": 0.1}
                self.client.put("/v1/links", json=link | {"egress_price_per_gb": 0.02}).raise_for_status()
        return self.client

    def _agent(self, spec: LocalAgent, token: str, ports: tuple[int, int]) -> Any:
        d = self.root / f"agent-{spec.cluster}"
        d.mkdir(parents=True, exist_ok=True)
        argv = [
            sys.executable, "-m", "agent", "--server", f"{self.lab.hub_ip}:{self.server.grpc_port}",
            "--token", token, "--region", spec.region, "--cluster", spec.cluster,
            "--provider", spec.provider, "--devices", spec.devices,
            "--price-per-device-hour", str(spec.price), "--sync-ports", f"{ports[0]}-{ports[1]}",
            "--work-dir", str(d), "--advertise-host", self.lab.regions[spec.region].ip,
        ]  # fmt: skip
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
        return self.lab.popen(spec.region, argv, log=d / "agent.log", env=env, cwd=REPO)

    def veths(self) -> dict[str, tuple[int, str]]:
        """Per region, a process inside its namespace (its agent) and the region's veth."""
        return {r: (self.agents[r].pid, self.lab.regions[r].dev) for r in REGIONS}

    def work_dir(self, node_cluster: str) -> Path:
        return self.root / f"agent-{node_cluster}"

    def wait_links(self, timeout_s: float | None = None, quiet_s: float = 20.0) -> list[dict[str, Any]]:
        """Until the agents have measured every link and no probe has been ordered for ``quiet_s``
        (every node probes its peers once: 4 MiB each, which must not land in a job's bytes), or
        the ceiling, ``patience(240)`` (the declared links then stand)."""
        assert self.client is not None
        timeout_s = timeout_s if timeout_s is not None else patience(240.0)
        deadline, seen, since = time.monotonic() + timeout_s, -1, time.monotonic()
        while True:
            links = self.client.get("/v1/links").raise_for_status().json()
            probes = len(self.client.get("/v1/links/probes", params={"limit": 500}).raise_for_status().json())
            if probes != seen:
                seen, since = probes, time.monotonic()
            pairs = {tuple(sorted((ln["src"], ln["dst"]))) for ln in links if ln["source"] == "measured"}
            measured = len(pairs) >= len(REGIONS) * (len(REGIONS) - 1) // 2
            if (measured and time.monotonic() - since >= quiet_s) or time.monotonic() > deadline:
                return links
            time.sleep(2)

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
        stop_agents([p for p in self.agents.values()])
        self.server.stop()
        self.db.drop()


def inter_region_tx(lab: NetLab) -> int:
    """Bytes the regions sent each other: every region's veth tx minus what the bridge passed on
    to the root namespace (the control plane's traffic)."""
    regions = sum(tx for tx, _ in lab.counters().values())
    hub = int(
        os.popen(f"ip netns exec {lab.bridge_ns} cat /sys/class/net/{lab.prefix}hb/statistics/tx_bytes")
        .read()
        .strip()
    )
    return regions - hub


def wait_job(client: httpx.Client, job_id: str, timeout_s: float, until: tuple[str, ...] = TERMINAL) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        job = client.get(f"/v1/jobs/{job_id}").raise_for_status().json()
        if job["status"] in until or time.monotonic() > deadline:
            return job
        time.sleep(0.5)


def utilisation(r: dict[str, Any], parts: tuple[str, ...]) -> float:
    """Share of the train loop (without its first step) spent on ``parts`` of the region's own work."""
    total, first = r["parts_total_s"], r.get("first_step_s") or {}
    own = sum(total.get(p, 0.0) - first.get(p, 0.0) for p in parts)
    return own / max(1e-9, r["train_s"] - first.get("wall_s", 0.0))


def run_job(
    fleet: Fleet, name: str, spec: dict[str, Any], timeout_s: float, fault: bool = False
) -> dict[str, Any]:
    client = fleet.client
    assert client is not None
    before = inter_region_tx(fleet.lab)
    with TxSampler(fleet.veths()) as sampler:
        job = client.post("/v1/jobs", json={"spec": spec, "choice": "cheapest"}).raise_for_status().json()
        jid = job["id"]
        killed: dict[str, Any] = {}
        if fault:
            killed = kill_mid_job(fleet, jid, spec["training"]["steps"])
        done = wait_job(client, jid, timeout_s)
    after = inter_region_tx(fleet.lab)
    if done["status"] != "succeeded":
        return {"mode": name, "status": done["status"], "reason": done["reason"], **killed}
    option = done["option"] or {}
    runtime = option.get("runtime") or {}
    per_task = done["result"]["per_task"]
    tasks = {t["region"]: t for t in done["tasks"]}
    results = {per_task[t["id"]]["region"]: per_task[t["id"]] for t in done["tasks"]}
    own = ("data_s", "compute_s", "optimizer_s")
    util = {r: utilisation(x, own) for r, x in results.items()}
    strict = {r: utilisation(x, ("compute_s",)) for r, x in results.items()}
    losses = []
    with tempfile.TemporaryDirectory() as tmp:
        for region, t in tasks.items():
            wd = fleet.work_dir(t["cluster_name"])
            (ckpt,) = wd.glob(f"checkpoints/{jid}/{region}")
            losses.append(
                held_out_loss(
                    {k: v for k, v in spec["model"].items() if k != "family"},
                    spec["data"],
                    final_state(ckpt, Path(tmp)),
                )
            )
    events = job_events(client, jid)
    spans = {r: [tuple(sp) for sp in x.get("round_spans") or []] for r, x in results.items()}
    wire = summary(round_figures(spans, sampler.tx_between, LINK_MBIT * 1e6 / 8))
    out = {
        "mode": name,
        "status": done["status"],
        "job_id": jid,
        "attempt": done["attempt"],
        "loss": sum(losses) / len(losses),
        "utilization": min(util.values()),
        "utilization_fwd_bwd": min(strict.values()),
        "utilization_by_region": util,
        # Balanced rounds: each region's own step count (they sum to regions x steps).
        "steps_by_region": {r: x["steps"] for r, x in results.items()},
        "parts_by_region": {r: {"train_s": x["train_s"], **x["parts_total_s"]} for r, x in results.items()},
        "last_step_by_region": {r: x.get("last_step_s") for r, x in results.items()},
        "wan_bytes_veth": after - before,
        "wan_bytes_metrics": sum(task_total(t, per_task, "wan_bytes_sent") or 0 for t in done["tasks"]),
        "wan_bytes_wire": wire_total(done["tasks"], per_task),
        # Each round's time over its bytes' time at the shaped rate (``_round_wire.py``).
        **wire,
        "job_wall_s": done["actual_duration_s"],
        "train_loop_s": max(x["train_s"] for x in results.values()),
        "checkpoint_every": runtime.get("checkpoint_every"),
        # the H and codec in force, as the job's option states them (chosen or the spec's own)
        "sync_every": (option.get("sync") or {}).get("every"),
        "compression": (option.get("sync") or {}).get("compression"),
        "sync_chosen": runtime.get("sync_every") is not None or runtime.get("sync_compression") is not None,
        "sync_choice": runtime.get("sync_choice"),
        "overlap": runtime.get("overlap"),
        "overlap_steps": runtime.get("overlap_steps"),
        "overlap_steps_at_end": {r: x.get("overlap_steps") for r, x in results.items()},
        "fragments": runtime.get("fragments"),
        "resumed_from": {r: x.get("resumed_from") for r, x in results.items()},
        "events": events,
        **killed,
    }
    if fault:
        out |= fault_figures(client, jid, killed, results)
    return out


def task_total(task: dict[str, Any], per_task: dict[str, Any], key: str) -> int | None:
    """A task's byte total: the larger of its last metrics and its result (the result's comes after
    the final exchange and leaving the peers); None where neither has it."""
    values = [
        v
        for v in ((task["last_metrics"] or {}).get(key), per_task.get(task["id"], {}).get(key))
        if isinstance(v, int | float)
    ]
    return int(max(values)) if values else None


def wire_total(tasks: list[dict[str, Any]], per_task: dict[str, Any]) -> int | None:
    """The tasks' wire bytes; None (unavailable) unless every task could read its kernel counters."""
    values = [task_total(t, per_task, "wan_wire_bytes_sent") for t in tasks]
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


def job_events(client: httpx.Client, job_id: str) -> list[str]:
    """The job's event kinds, in order (its persisted history, as the events stream serves it)."""
    body = client.get(f"/v1/jobs/{job_id}/events", params={"follow": False}).raise_for_status().text
    data = [json.loads(line[5:]) for line in body.splitlines() if line.startswith("data:")]
    return [d["kind"] for d in data if isinstance(d, dict) and "kind" in d]


def kill_mid_job(fleet: Fleet, job_id: str, steps: int) -> dict[str, Any]:
    """kill -9 the victim region's agent (with its workers, one process group) once every region
    is past 40 % of the run."""
    client = fleet.client
    assert client is not None
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}").raise_for_status().json()
        if job["status"] in TERMINAL:
            raise RuntimeError(f"fault run ended before the kill: {job['status']} {job['reason']}")
        at = [(t["last_metrics"] or {}).get("step", 0) for t in job["tasks"]]
        if job["tasks"] and min(at) >= 0.4 * steps:
            break
        time.sleep(0.3)
    victim = next(t for t in job["tasks"] if t["region"] == VICTIM)
    kill_agent(fleet.agents[VICTIM])
    return {"killed_task": victim["id"], "killed_at_report": (victim["last_metrics"] or {}).get("step", 0)}


def fault_figures(
    client: httpx.Client, job_id: str, killed: dict[str, Any], results: dict[str, Any]
) -> dict[str, Any]:
    """Steps the job had to redo: how far the lost task had got (its last reported step, from the
    metrics series) past the step its replacement resumed at."""
    series = client.get(f"/v1/jobs/{job_id}/metrics", params={"max_points": 10000}).raise_for_status().json()
    lost_steps = [
        p["step"] for pts in series["series"].values() for p in pts if p["task_id"] == killed["killed_task"]
    ]
    reached = max(lost_steps, default=killed["killed_at_report"])
    resumed = results.get(VICTIM, {}).get("resumed_from") or 0
    return {
        "fault_reached_step": reached,
        "fault_resumed_at": resumed,
        "fault_lost_steps": max(0, reached - resumed),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--quick", action="store_true", help="a tiny model and batch: checks the script")
    ap.add_argument("--only", nargs="*", help="run only these modes (names as in the table)")
    ap.add_argument("--no-fault", action="store_true")
    args = ap.parse_args()
    why = netns_available()
    if why:
        print(f"needs network namespaces: {why}", file=sys.stderr)
        return 2
    model, batch = (QUICK_MODEL, QUICK_BATCH) if args.quick else (MODEL, BATCH)
    rows: dict[str, dict[str, Any]] = {}
    t_all = time.monotonic()
    with (
        tempfile.TemporaryDirectory() as tmp,
        NetLab(REGIONS, LINK_MBIT, prefix=PREFIX, subnet=SUBNET) as lab,
    ):
        print(lab.describe() + "; no latency emulation (netem absent)", flush=True)
        fleet = Fleet(lab, Path(tmp))
        try:
            fleet.start()
            links = [
                f"{ln['src']}-{ln['dst']} {ln['bandwidth_gbps'] * 1e3:.0f} Mbit/s ({ln['source']})"
                for ln in fleet.wait_links()
            ]
            print("links: " + ", ".join(links), flush=True)
            for name, sync in modes():
                if args.only and name not in args.only:
                    continue
                spec = job_spec(
                    name.replace(" ", "-").replace("=", "").lower(), model, batch, args.steps, sync
                )
                rows[name] = r = run_job(fleet, name, spec, patience(3600.0))
                print(json.dumps(r), flush=True)
            if not args.no_fault:
                spec = job_spec("fault-diloco-h20", model, batch, args.steps, FAULT_SYNC)
                rows["fault: diloco H=20"] = r = run_job(
                    fleet, "fault: diloco H=20", spec, patience(3600.0), fault=True
                )
                print(json.dumps(r), flush=True)
        finally:
            fleet.stop()
    print()
    print(
        "| mode | status | held-out loss | vs sync | utilisation (own work) | fwd/bwd only | WAN MB (veth) "
        "| WAN MB (wire) | veth vs wire | WAN MB (gRPC) | job wall s | train loop s | H | codec "
        "| checkpoint every | overlap (steps) | fragments | round s (p50) | round / wire (p50) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    sync_loss = rows.get("sync", {}).get("loss")

    def mb(n: int | None) -> str:
        return "unavailable" if n is None else f"{n / 1e6:.2f}"

    def num(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    def star(r: dict[str, Any]) -> str:
        return "*" if r.get("sync_chosen") else ""

    def gap(r: dict[str, Any]) -> str:
        if r["wan_bytes_wire"] is None or not r["wan_bytes_veth"]:
            return "-"
        return f"{(r['wan_bytes_veth'] - r['wan_bytes_wire']) / r['wan_bytes_veth'] * 100:+.2f} %"

    for r in rows.values():
        if r["status"] != "succeeded":
            print(f"| {r['mode']} | {r['status']}: {r.get('reason', '')} |")
            continue
        vs = f"{r['loss'] / sync_loss:.3f}" if sync_loss else "-"
        print(f"| {r['mode']} | {r['status']} | {r['loss']:.4f} | {vs} | {r['utilization']:.3f} | "
              f"{r['utilization_fwd_bwd']:.3f} | {r['wan_bytes_veth'] / 1e6:.2f} | "
              f"{mb(r['wan_bytes_wire'])} | {gap(r)} | {r['wan_bytes_metrics'] / 1e6:.2f} | "
              f"{r['job_wall_s']:.1f} | {r['train_loop_s']:.1f} | {r['sync_every']}{star(r)} | "
              f"{r['compression']}{star(r)} | {r['checkpoint_every']} | "
              f"{r['overlap']} ({r['overlap_steps']}) | {r['fragments']} | {num(r['round_s_p50'])} | "
              f"{num(r['round_time_over_wire_p50'])} |")  # fmt: skip

    def get(mode: str, key: str) -> Any:
        return rows.get(mode, {}).get(key)

    planned = rows.get("diloco planned", {})
    sync_row = rows.get("sync", {})
    # The veth counters against the workers' wire count; unavailable (None) where a task could not
    # read its kernel counters. The fault run is left out: the killed worker's last bytes are on
    # the veths and in no report.
    counted = [
        r
        for k, r in rows.items()
        if r.get("status") == "succeeded" and not k.startswith("fault") and r["wan_bytes_veth"] > 0
    ]
    agreements = (
        []
        if any(r["wan_bytes_wire"] is None for r in counted)
        else [abs(r["wan_bytes_veth"] - r["wan_bytes_wire"]) / r["wan_bytes_veth"] for r in counted]
    )
    fault = rows.get("fault: diloco H=20", {})
    summary = {
        "diloco_h20_utilization": get("diloco H=20", "utilization"),
        "diloco_h100_utilization": get("diloco H=100", "utilization"),
        "sync_utilization": get("sync", "utilization"),
        "diloco_wan_bytes_ratio": (
            sync_row["wan_bytes_veth"] / planned["wan_bytes_veth"]
            if planned.get("loss") and sync_row.get("loss")
            else None
        ),
        "diloco_loss_gap_vs_sync": (
            planned["loss"] / sync_row["loss"] - 1 if planned.get("loss") and sync_row.get("loss") else None
        ),
        "counter_agreement": max(agreements) if agreements else None,
        # per mode: the median round's time over its bytes' time at the link rate
        "round_time_over_wire_p50": {
            k: r.get("round_time_over_wire_p50") for k, r in rows.items() if not k.startswith("fault")
        },
        "fault_lost_steps": fault.get("fault_lost_steps"),
        "fault_job_succeeded": fault.get("status") == "succeeded" if fault else None,
        "checkpoint_every": fault.get("checkpoint_every"),
    }
    if planned.get("sync_choice"):
        print(f"* chosen by the planner: {planned['sync_choice']}")
    print(f"wall {time.monotonic() - t_all:.0f} s")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
