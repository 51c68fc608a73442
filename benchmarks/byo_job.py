"""A user's own job, end to end: their code, their regions' data, their model back.

    python benchmarks/byo_job.py [--steps 300] [--link-mbit 20] [--store embedded s3]

Network: 3 regions in network namespaces (``benchmarks/netlab.py``, subnet 10.213.33.0/24, tc tbf
on both ends of every region's link); the control plane in the root namespace, reached over the
hub, so every byte a region stages crosses its own shaped link.

Fleet: one real ``cpn agent`` per namespace (one CPU slot each, sandboxed with bubblewrap), a
``cpn server`` on PostgreSQL + Redis (a fresh database), its artifact store embedded (a directory)
or S3 (moto's server mode on the hub address).

For each store:
1. Upload ``examples/byo`` (``cpn jobs submit --code``'s packing) and the three regions' shards
   (``examples/byo/corpus.py``), each marked resident.
2. Quote and run the job: DiLoCo across the three regions. Read the quote's staging estimate,
   the tasks' staging reports and their held-out loss. The estimate is judged against the
   slowest task's whole staging as its agent timed it (code, venv and data, start to end: what
   the devices waited for), for each store's first job, whose quote knows only what the agents
   measured after registering (their store probe and venv build; the benchmark waits for those
   as it waits for the link probes).
3. Download the model, load it into the example's own model class and evaluate it on the held-out
   text here; compare with the loss the worker reported.
4. Shard bytes crossing regions: every other region's shard digest looked for in each node's
   files (the cache, the task dirs), and each region's veth bytes from the hub during staging
   set against its own shard (shown beside).
5. A second job with the same code and data: its tasks must stage nothing (cache hits).
Then (once, embedded store) hostile entrypoints, one job each, that try to: read the node's key,
read another job's directory, write outside their own, signal the agent, fill the disk. Each
prints ``ESCAPED <what>`` if it got through; the benchmark also checks each effect itself (the
agent alive, nothing written outside, the disk not filled).

Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
EXAMPLE = REPO / "examples" / "byo"
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))


import httpx  # noqa: E402
from _host import patience  # noqa: E402
from control_plane import Database, Replica, admin_client, free_port, server_env  # noqa: E402
from netlab import NetLab, netns_available  # noqa: E402

from contracts.lifetime import keeper_command  # noqa: E402
from service_layer.cli.demo import wait_for_clusters  # noqa: E402
from service_layer.cli.local_fleet import LocalAgent, enroll, stop_agents  # noqa: E402
from service_layer.code_archive import pack_code  # noqa: E402

SUBNET, PREFIX, PORTS = "10.213.33", "cpnbyo", (29900, 29949)
TERMINAL = ("succeeded", "failed", "cancelled")
REGIONS = ("eu-west", "us-east", "ap-south")
PRICES = {"eu-west": 1.0, "us-east": 1.1, "ap-south": 1.2}
BUCKET = "cpn-artifacts"
HOSTILE = ("read_node_key", "read_other_job", "write_outside", "signal_agent", "fill_disk")
TASK_DISK_GB = 0.05  # the agents' per-task disk quota: the fill-disk attempt must stop there


def example_modules() -> tuple[Any, Any, Any]:
    sys.path.insert(0, str(EXAMPLE))
    import corpus  # noqa: PLC0415
    import model  # noqa: PLC0415
    import train  # noqa: PLC0415

    return corpus, model, train


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


class MotoS3:
    """moto's S3 server on the hub address, so the namespaces reach presigned URLs."""

    def __init__(self, host: str, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://{host}:{self.port}"
        # Under a keeper: moto ends with the benchmark, however the benchmark ends.
        kept, fds = keeper_command(
            [sys.executable, "-m", "moto.server", "-H", host, "-p", str(self.port)], grace_s=5
        )
        self.proc = subprocess.Popen(
            kept,
            stdout=open(log, "wb"),  # noqa: SIM115 - the child owns it
            stderr=subprocess.STDOUT,
            pass_fds=fds,
        )
        deadline = time.monotonic() + patience(60.0)
        while True:
            try:
                httpx.get(self.url, timeout=2)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"moto server did not start: {log.read_text()[-2000:]}") from None
                time.sleep(0.2)
        import boto3  # noqa: PLC0415

        boto3.client(
            "s3",
            endpoint_url=self.url,
            aws_access_key_id="test",
            aws_secret_access_key="test",
            region_name="us-east-1",
        ).create_bucket(Bucket=BUCKET)

    def env(self) -> dict[str, str]:
        return {
            "CPN_ARTIFACT_STORE": "s3",
            "CPN_S3_ENDPOINT_URL": self.url,
            "CPN_S3_BUCKET": BUCKET,
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            self.proc.wait(10)


class Fleet:
    """The control plane (with its store) and one agent per region's namespace."""

    def __init__(self, lab: NetLab, root: Path, store: str, link_mbit: float) -> None:
        self.lab, self.root, self.store, self.link_mbit = lab, root, store, link_mbit
        self.db = Database()
        self.admin_key = "cpn_admin_" + secrets.token_urlsafe(16)
        self.s3 = MotoS3(lab.hub_ip, root / "moto.log") if store == "s3" else None
        http_port = free_port()
        env = server_env(
            self.db, root, self.admin_key,
            CPN_GRPC_HOST=lab.hub_ip, CPN_HTTP_HOST="0.0.0.0", CPN_PUBLIC_URL=f"http://{lab.hub_ip}:{http_port}",
            CPN_HEARTBEAT_INTERVAL_S="1", CPN_HEARTBEAT_MISSES="5", CPN_LINK_PROBE_INTERVAL_S="86400",
            **(self.s3.env() if self.s3 else {}),
        )  # fmt: skip
        self.server = Replica(f"byo-{store}", env, root)
        self.server.http_port = http_port
        self.agents: dict[str, Any] = {}
        self.client: httpx.Client | None = None

    def start(self) -> httpx.Client:
        self.server.start()
        self.client = admin_client(self.server, self.admin_key)
        specs = [LocalAgent(r, f"{r}-c0", f"p-{r}", PRICES[r], devices="cpu:1") for r in REGIONS]
        tokens = enroll(self.client, specs, note="byo-job")
        for s in specs:
            self.agents[s.region] = self._agent(s, tokens[s.provider])
        wait_for_clusters(self.client, len(REGIONS), timeout_s=patience(600.0))
        self.wait_staging_probes()
        for i, a in enumerate(REGIONS):  # the egress price; bandwidth and latency the agents measure
            for b in REGIONS[i + 1 :]:
                link = {"src": a, "dst": b, "bandwidth_gbps": self.link_mbit / 1e3, "latency_ms": 0.1}
                ok(self.client.put("/v1/links", json=link | {"egress_price_per_gb": 0.02}))
        self.wait_links()
        return self.client

    def wait_links(self, timeout_s: float | None = None) -> None:
        """Until the agents have probed every link between the regions in both directions, and no
        probe is under way (or the ceiling, ``patience(300)``: the declared links then stand, and
        it says so), so no probe shares a region's link with a job's staging and its bytes are not
        counted in a job's."""
        assert self.client is not None
        timeout_s = timeout_s if timeout_s is not None else patience(300.0)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            probes = ok(self.client.get("/v1/links/probes", params={"limit": 500}))
            done = {(p["src_region"], p["dst_region"]) for p in probes if p["status"] == "ok"}
            pending = any(p["status"] == "pending" for p in probes)
            if len(done) >= len(REGIONS) * (len(REGIONS) - 1) and not pending:
                return
            time.sleep(2)
        print(
            f"links: not every pair probed within {timeout_s:.0f} s; the declared links stand",
            file=sys.stderr,
        )

    def wait_staging_probes(self, timeout_s: float | None = None) -> None:
        """Until every agent reported what staging costs on its node (it measures once its profile
        is in), so the first quote is priced from it; at the ceiling (``patience(300)``) it says
        which nodes had not."""
        assert self.client is not None
        timeout_s = timeout_s if timeout_s is not None else patience(300.0)
        deadline = time.monotonic() + timeout_s
        nodes: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            nodes = [n for c in ok(self.client.get("/v1/clusters")) for n in c["nodes"]]
            if len(nodes) >= len(REGIONS) and all(n["staging"] for n in nodes):
                return
            time.sleep(1)
        missing = [n["hostname"] or n["id"] for n in nodes if not n["staging"]]
        print(f"staging probes: {missing} not reported within {timeout_s:.0f} s", file=sys.stderr)

    def work_dir(self, region: str) -> Path:
        return self.root / f"agent-{region}"

    def _agent(self, spec: LocalAgent, token: str) -> Any:
        d = self.work_dir(spec.region)
        d.mkdir(parents=True, exist_ok=True)
        argv = [
            sys.executable, "-m", "agent", "--server", f"{self.lab.hub_ip}:{self.server.grpc_port}",
            "--token", token, "--region", spec.region, "--cluster", spec.cluster,
            "--provider", spec.provider, "--devices", spec.devices,
            "--price-per-device-hour", str(spec.price), "--sync-ports", f"{PORTS[0]}-{PORTS[1]}",
            "--work-dir", str(d), "--advertise-host", self.lab.regions[spec.region].ip,
            "--task-disk-gb", str(TASK_DISK_GB),
        ]  # fmt: skip
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
        return self.lab.popen(spec.region, argv, log=d / "agent.log", env=env, cwd=REPO)

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
        stop_agents(list(self.agents.values()))
        self.server.stop()
        if self.s3 is not None:
            self.s3.stop()
        self.db.drop()


def upload(client: httpx.Client, path: Path, kind: str) -> dict[str, Any]:
    with open(path, "rb") as f:
        r = client.post(
            "/v1/artifacts",
            params={"name": path.name, "kind": kind},
            content=iter(lambda: f.read(1 << 20), b""),
            headers={"content-length": str(path.stat().st_size)},
        )
    r.raise_for_status()
    return r.json()


def pack(src: Path, dest: Path, exclude: tuple[str, ...] = ()) -> tuple[Path, str | None]:
    packed = pack_code(src, dest, exclude=exclude)
    return packed.path, packed.requirements_digest


def byo_spec(name: str, code: dict[str, Any], shards: dict[str, str], steps: int) -> dict[str, Any]:
    spec = json.loads(json.dumps(__import__("yaml").safe_load((EXAMPLE / "job.yaml").read_text())))
    spec["name"] = name
    spec["training"]["steps"] = steps
    spec["code"] = code
    spec["data"] = {"shards": {r: {"uri": f"artifact:{d}", "resident": True} for r, d in shards.items()}}
    return spec


def wait_job(client: httpx.Client, job_id: str, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        job = client.get(f"/v1/jobs/{job_id}").raise_for_status().json()
        if job["status"] in TERMINAL or time.monotonic() > deadline:
            return job
        time.sleep(0.5)


def rx_from_hub(lab: NetLab) -> dict[str, int]:
    """Bytes each region's veth received so far (the hub's and the other regions' together)."""
    return {name: rx for name, (_tx, rx) in lab.counters().items()}


def ok(r: httpx.Response) -> Any:
    """The answer's JSON; a refusal stops the run with what the server said."""
    if r.is_error:
        raise RuntimeError(f"{r.request.method} {r.request.url.path}: {r.status_code} {r.text[:2000]}")
    return r.json()


def submit(client: httpx.Client, spec: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Quote, then accept its cheapest option; (the option, the job)."""
    quote = ok(client.post("/v1/quotes", json=spec))
    option = min(quote["options"], key=lambda o: o["estimates"]["cost"]["total"])
    job = ok(client.post("/v1/jobs", json={"quote_id": quote["id"], "option_id": option["id"]}))
    return option, job


def staging_items(job: dict[str, Any]) -> list[dict[str, Any]]:
    """Every staged item of every task, as the agents reported them in the task results."""
    out = []
    for tid, r in (job.get("result") or {}).get("per_task", {}).items():
        for item in (r.get("staging") or {}).get("items", []):
            out.append(item | {"task": tid, "region": r.get("region")})
    return out


def staging_seconds(job: dict[str, Any]) -> dict[str, float]:
    """Per region, its task's whole staging as its agent timed it (start to end)."""
    out = {}
    for r in (job.get("result") or {}).get("per_task", {}).values():
        seconds = (r.get("staging") or {}).get("seconds")
        if isinstance(seconds, int | float):
            out[r.get("region")] = float(seconds)
    return out


def held_out_loss(model: Any, dataset: Any, loss_fn: Any, batch_size: int) -> float:
    """Mean loss over the held-out windows in the worker's batches (its result states the size),
    computed here on its own."""
    import torch  # noqa: PLC0415

    total, n = 0.0, len(dataset)
    with torch.no_grad():
        for start in range(0, n, batch_size):
            xs, ys = zip(*(dataset[i] for i in range(start, min(n, start + batch_size))), strict=True)
            total += float(loss_fn(model(torch.stack(xs)), torch.stack(ys))) * len(xs)
    return total / n


def evaluate_download(
    client: httpx.Client, job_id: str, dest: Path, batch_size: int
) -> tuple[float, list[str]]:
    """Fetch the job's artifacts, load the model and evaluate it on the held-out text as the worker did."""
    from safetensors.torch import load_file  # noqa: PLC0415

    _, model_mod, train = example_modules()
    listing = client.get(f"/v1/jobs/{job_id}/artifacts").raise_for_status().json()
    names = []
    for art in listing:
        with client.stream("GET", f"/v1/artifacts/{art['id']}") as r:
            r.raise_for_status()
            with open(dest / art["name"], "wb") as f:
                for chunk in r.iter_bytes():
                    f.write(chunk)
        assert sha256_file(dest / art["name"]) == art["digest"], art
        names.append(art["name"])
    model = model_mod.CharModel(train.CONFIG)
    model.load_state_dict(load_file(str(dest / "model.safetensors")))
    model.eval()
    return held_out_loss(model, train.eval_dataset(), train.lm_loss, batch_size), names


def foreign_shards(fleet: Fleet, digests: dict[str, str], sizes: dict[str, int]) -> int:
    """Bytes of other regions' shards found among each region's node files (the blob cache, task
    and checkpoint dirs): a file of a foreign shard's size is hashed and compared."""
    found = 0
    for region in REGIONS:
        others = {sizes[r]: d for r, d in digests.items() if r != region}
        for path in fleet.work_dir(region).rglob("*"):
            size = path.stat().st_size if path.is_file() and not path.is_symlink() else -1
            if size in others and sha256_file(path) == others[size]:
                found += size
    return found


def run_store(args: argparse.Namespace, store: str, lab: NetLab, tmp: Path) -> dict[str, Any]:
    corpus, _, _ = example_modules()
    root = tmp / store
    root.mkdir()
    shard_files = corpus.write_shards(root / "shards")
    fleet = Fleet(lab, root, store, args.link_mbit)
    out: dict[str, Any] = {"store": store, "jobs": []}
    try:
        client = fleet.start()
        archive, req_digest = pack(EXAMPLE, root / "byo-code.tar.gz", exclude=("shards/*",))
        code_art = upload(client, archive, "code")
        code = {"digest": code_art["digest"], "requirements_digest": req_digest}
        shards = {r: upload(client, p, "data")["digest"] for r, p in shard_files.items()}
        for run in (1, 2):
            before = rx_from_hub(lab)
            option, job = submit(client, byo_spec(f"byo-{store}-{run}", code, shards, args.steps))
            done = wait_job(client, job["id"], patience(3600.0))
            after = rx_from_hub(lab)
            rec: dict[str, Any] = {
                "run": run,
                "job_id": job["id"],
                "status": done["status"],
                "reason": done["reason"],
                "staging_estimate_s": option["estimates"].get("staging_s"),
                "rx_bytes": {r: after[r] - before[r] for r in REGIONS},
            }
            items = staging_items(done)
            rec["staging_items"] = items
            rec["staging_quoted"] = option["estimates"].get("staging")
            # What the quote prices as staging: the slowest task's whole staging (code, venv,
            # data), as its agent timed it; the venv's build is also shown apart (``venv_s``).
            moved = [i for i in items if i["kind"] in ("code", "data")]
            rec["staging_measured_s"] = max(staging_seconds(done).values(), default=None)
            rec["venv_s"] = max((i["seconds"] for i in items if i["kind"] == "venv"), default=None)
            # Beside it, the start-up the same host shares priced (workers' spawn to first step).
            rec["startup_estimate_s"] = option["estimates"].get("startup_s")
            rec["startup_measured_s"] = max(
                (
                    r["startup_s"]
                    for r in (done.get("result") or {}).get("per_task", {}).values()
                    if "startup_s" in r
                ),
                default=None,
            )
            rec["cache_hits"] = sum(1 for i in items if i.get("cache_hit"))
            rec["restaged_bytes"] = sum(i.get("bytes", 0) for i in moved if not i.get("cache_hit"))
            per_task = (done.get("result") or {}).get("per_task", {})
            evaluated = next((r for r in per_task.values() if r.get("eval_loss") is not None), {})
            rec["eval_loss_reported"] = evaluated.get("eval_loss")
            if done["status"] == "succeeded":
                dl = root / f"download-{run}"
                dl.mkdir()
                try:
                    rec["eval_loss_local"], rec["downloaded"] = evaluate_download(
                        client, job["id"], dl, evaluated["eval"]["batch_size"]
                    )
                except Exception as exc:  # shown in the table: the download or the load failed
                    rec["download_error"] = repr(exc)
            out["jobs"].append(rec)
            print(
                json.dumps({k: v for k, v in rec.items() if k not in ("staging_items", "staging_quoted")}),
                flush=True,
            )
            print(staging_table(rec, done), flush=True)
        out["shard_sizes"] = {r: p.stat().st_size for r, p in shard_files.items()}
        out["shard_bytes_crossing_regions"] = foreign_shards(fleet, shards, out["shard_sizes"])
        if store == args.store[0] and not args.no_hostile:
            out["hostile"] = run_hostile(fleet, client, root)
    finally:
        fleet.stop()
    return out


def staging_table(rec: dict[str, Any], job: dict[str, Any]) -> str:
    """Per region: the staging as quoted (its parts and their basis) beside what its agent timed."""
    quoted = {r["region"]: r for r in (rec.get("staging_quoted") or {}).get("reads", [])}
    timed = staging_seconds(job)
    lines = [
        "| region | quoted | fetches x fixed s | bytes / rate | venv s (x share) | basis | timed s | items |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for region in sorted(set(quoted) | set(timed)):
        q = quoted.get(region, {})
        parts = [i for i in rec["staging_items"] if i.get("region") == region]
        shown = ", ".join(
            f"{i['kind']} {i['seconds']:.3f}"
            + (" (hit)" if i.get("cache_hit") else f" (cpu {i['cpu_s']:.3f})" if "cpu_s" in i else "")
            for i in parts
        )
        fetches = f"{q.get('fetches', 0)} x {q.get('fetch_fixed_s', 0):.4f}"
        lines.append(
            f"| {region} | {q.get('seconds', 0):.3f} | {fetches}"
            f" | {q.get('bytes', 0)} / {q.get('bytes_per_s', 0):.0f} | {q.get('venv_s', 0):.3f}"
            f" (x {q.get('share', 1):.2f}) | {q.get('rate_basis', '')}/{q.get('fixed_basis', '')}/"
            f"{q.get('venv_basis', '')} | {timed.get(region, 0):.3f} | {shown} |"
        )
    return "\n".join(lines)


def hostile_archive(root: Path) -> Path:
    src = root / "hostile-code"
    src.mkdir()
    shutil.copy(HERE / "byo_hostile.py", src / "hostile.py")
    return pack(src, root / "hostile.tar.gz")[0]


def node_secrets(fleet: Fleet, region: str, own_job: str) -> set[str]:
    """Hashes of what a tenant must not read on the node: the agent's files outside this job's
    task dirs (its state file with the node key, other jobs' assignments and checkpoints), the
    node token, and the agent's own environment."""
    out: set[str] = set()
    wd = fleet.work_dir(region)
    for path in wd.rglob("*"):
        if path.is_file() and not path.is_symlink() and own_job not in path.parts:
            try:
                out.add(sha256_file(path))
            except OSError:
                continue
    state = wd / "agent-state.json"
    if state.exists():
        for value in json.loads(state.read_text()).values():
            if isinstance(value, str) and value:
                out.add("sha256:" + hashlib.sha256(value.encode()).hexdigest())
    with contextlib.suppress(OSError):
        out.add(
            "sha256:"
            + hashlib.sha256(Path(f"/proc/{fleet.agents[region].pid}/environ").read_bytes()).hexdigest()
        )
    return out


def judge_attempt(name: str, lines: list[str], secrets_: set[str], fleet: Fleet, region: str) -> list[str]:
    """What got through, judged on the node's side (a line the tenant prints proves nothing alone)."""
    escapes = [ln for ln in lines if ln.startswith("FOUND") and ln.rsplit(" ", 1)[-1] in secrets_]
    for ln in lines:
        if ln.startswith("WROTE ") and name == "write_outside":
            target = Path(ln.split(" ", 2)[1])
            if target.exists() and target.read_text(errors="replace") == "written by a tenant":
                escapes.append(f"{ln} (on the node)")
                target.unlink()
    if fleet.agents[region].poll() is not None:
        escapes.append("the agent died")
    if name == "fill_disk":
        biggest = max((p.stat().st_size for p in fleet.work_dir(region).rglob("filler.bin")), default=0)
        if biggest > TASK_DISK_GB * 1024**3 * 1.5:
            escapes.append(f"filler.bin reached {biggest} bytes past the {TASK_DISK_GB} GB quota")
    return escapes


def run_hostile(fleet: Fleet, client: httpx.Client, root: Path) -> dict[str, Any]:
    code = upload(client, hostile_archive(root), "code")
    region = "eu-west"  # where the earlier jobs left their directories: the bystanders
    attempts: dict[str, Any] = {}
    for name in HOSTILE:
        spec = {
            "name": f"hostile-{name.replace('_', '-')}",
            "entrypoint": f"hostile:{name}",
            "code": {"digest": code["digest"]},
            "model": {"family": "gpt", "n_layers": 1, "d_model": 8, "n_heads": 2, "vocab": 16, "seq_len": 8},
            "training": {"steps": 2, "global_batch_tokens": 64},
            "parallelism": {"dp": 1, "tp": 1, "pp": 1, "zero": 0},
            "sync": {"mode": "sync"},
            "qos": {"regions": [region]},
        }
        job = client.post("/v1/jobs", json={"spec": spec, "choice": "cheapest"}).raise_for_status().json()
        done = wait_job(client, job["id"], patience(600.0))
        secrets_ = node_secrets(fleet, region, job["id"])
        logs = client.get(f"/v1/jobs/{job['id']}/logs", params={"limit": 5000}).raise_for_status().json()
        lines = [ln["line"] for ln in logs.get("lines", [])]
        attempts[name] = {
            "status": done["status"],
            "reason": (done["reason"] or "")[:300],
            "tried": any(ln.startswith("ATTEMPT") for ln in lines),
            "escaped": judge_attempt(name, lines, secrets_, fleet, region),
            "denied": sum(ln.startswith("DENIED") for ln in lines),
        }
        print(json.dumps({"hostile": name} | attempts[name]), flush=True)
    return attempts


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--link-mbit", type=float, default=20.0)
    ap.add_argument("--store", nargs="+", default=["embedded", "s3"], choices=["embedded", "s3"])
    ap.add_argument("--no-hostile", action="store_true")
    args = ap.parse_args()
    why = netns_available()
    if why:
        print(f"needs network namespaces: {why}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    results = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        NetLab(REGIONS, args.link_mbit, prefix=PREFIX, subnet=SUBNET) as lab,
    ):
        print(lab.describe(), flush=True)
        for store in args.store:
            results.append(run_store(args, store, lab, Path(tmp)))
    jobs = [j for r in results for j in r["jobs"]]
    print()
    print("| store | run | status | staging est s | staging measured s | cache hits | restaged bytes "
          "| eval loss (worker) | eval loss (downloaded) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        for j in r["jobs"]:
            print(f"| {r['store']} | {j['run']} | {j['status']} | {j['staging_estimate_s']} | "
                  f"{j['staging_measured_s']} | {j['cache_hits']} | {j['restaged_bytes']} | "
                  f"{j['eval_loss_reported']} | {j.get('eval_loss_local')} |")  # fmt: skip
    hostile = next((r["hostile"] for r in results if "hostile" in r), {})
    diffs = [
        abs(j["eval_loss_local"] - j["eval_loss_reported"])
        for j in jobs
        if j.get("eval_loss_local") is not None and j.get("eval_loss_reported") is not None
    ]
    firsts = [j for j in jobs if j["run"] == 1 and j["staging_estimate_s"] and j["staging_measured_s"]]
    seconds = [j for j in jobs if j["run"] == 2]
    summary = {
        "jobs": len(jobs),
        "succeeded": sum(j["status"] == "succeeded" for j in jobs),
        "model_downloaded": sum("model.safetensors" in j.get("downloaded", []) for j in jobs),
        "eval_loss_abs_diff": max(diffs) if len(diffs) == len(jobs) else None,
        "shard_bytes_crossing_regions": sum(r["shard_bytes_crossing_regions"] for r in results),
        "staging_time_err": max(
            (
                abs(j["staging_estimate_s"] - j["staging_measured_s"]) / j["staging_measured_s"]
                for j in firsts
            ),
            default=None,
        ),
        "second_run_cache_hits": min((j["cache_hits"] for j in seconds), default=0),
        "second_run_restaged_bytes": max((j["restaged_bytes"] for j in seconds), default=None),
        # an attempt counts once its code ran (it printed ATTEMPT) or the sandbox stopped it first
        "sandbox_attempts": sum(a["tried"] or a["status"] == "failed" for a in hostile.values()),
        "sandbox_escapes": sum(bool(a["escaped"]) for a in hostile.values()),
    }
    print(f"wall {time.monotonic() - t0:.0f} s")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
