"""Cross-region sync over an emulated WAN: every mode on 3 regions training a tiny GPT.

    python benchmarks/wan_sync.py [--steps 500] [--quick]

Each region is a real worker process (``python -m training.worker``) whose leader serves gRPC on
loopback; every link between regions is shaped in the transport (100 Mbit/s, 50 ms one way; plus a
1 Gbit/s variant for ``sync`` and ``diloco``). Per mode: wall time per step, utilisation (share of
wall time outside the sync hook; also the runtime's compute-only share), WAN bytes sent by all
regions, the final models' held-out loss against ``sync`` at equal tokens and against the entropy
floor. A separate probe measures transfer goodput against the shaped rate. Prints a table, then
one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _host import patience  # noqa: E402
from _regions import region_configs, run_regions  # noqa: E402
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save  # noqa: E402

from contracts.links import LinkSpec  # noqa: E402
from contracts.model import GPTConfig  # noqa: E402
from contracts.sync_config import SyncConfig  # noqa: E402
from training.checkpoint import latest_checkpoint  # noqa: E402
from training.compression.codecs import encode_tensor, get_codec  # noqa: E402
from training.data.markov import MarkovSource  # noqa: E402
from training.models.gpt import GPT  # noqa: E402
from training.sync.messages import Meta, OutMessage  # noqa: E402
from training.sync.stats import TransferStats  # noqa: E402
from training.sync.transport import PeerClient, SyncServer  # noqa: E402
from training.wan.shaper import LinkShaper  # noqa: E402

REGIONS = ["ap-south", "eu-west", "us-east"]
MODEL = {"n_layers": 2, "d_model": 32, "n_heads": 4, "vocab": 32, "seq_len": 32}
DATA = {"kind": "synthetic-markov", "seed": 3}


def links(mbps: float, ms: float) -> dict[str, dict[str, float]]:
    return {
        f"{a}|{b}": {"bandwidth_mbps": mbps, "latency_ms": ms}
        for i, a in enumerate(REGIONS)
        for b in REGIONS[i + 1 :]
    }


def modes(steps: int) -> list[tuple[str, str, dict[str, Any], float]]:
    h = steps // 4
    # Every region runs the same steps (no balanced rounds); overlapped DiLoCo keeps the local progress.
    fixed = {"balance": False, "overlap_merge": "progress"}
    return [
        ("sync", "sync", {"mode": "sync", "every": 1}, 100),
        ("local_sgd", "local_sgd", {"mode": "local_sgd", "every": 20, "balance": False}, 100),
        (
            "diloco",
            "diloco",
            {"mode": "diloco", "every": h, "compression": "int8", "overlap": True, **fixed},
            100,
        ),
        (
            "diloco-stream",
            "diloco",
            {"mode": "diloco", "every": h, "fragments": 5, "compression": "int8", "overlap": True, **fixed},
            100,
        ),
        ("gossip", "gossip", {"mode": "gossip", "every": 10, "compression": "bf16"}, 100),
        ("ssp", "ssp", {"mode": "ssp", "every": 10, "staleness": 1, "compression": "int8"}, 100),
        ("async", "async", {"mode": "async", "every": 10, "compression": "int8", "overlap": True}, 100),
        ("sync@1G", "sync", {"mode": "sync", "every": 1}, 1000),
        (
            "diloco@1G",
            "diloco",
            {"mode": "diloco", "every": h, "compression": "int8", "overlap": True, **fixed},
            1000,
        ),
    ]


def eval_loss(ckpt_root: Path, tmp: Path, batches: int = 8) -> float:
    path = latest_checkpoint(ckpt_root)
    if path is None:
        raise RuntimeError(f"no checkpoint under {ckpt_root}")
    out = tmp / "final.pt"
    dcp_to_torch_save(str(path), str(out))
    state = torch.load(out, weights_only=False)
    model = GPT(GPTConfig(**MODEL))
    model.load_state_dict(state["model"])
    model.eval()
    src = MarkovSource(MODEL["vocab"], DATA["seed"])
    gen = torch.Generator().manual_seed(12345)  # held out: no training stream uses this generator
    total = 0.0
    with torch.no_grad():
        for _ in range(batches):
            x = src.sample(64, MODEL["seq_len"] + 1, gen)
            total += float(model(x[:, :-1], x[:, 1:])[1])
    return total / batches


def run_mode(name: str, sync: dict[str, Any], mbps: float, steps: int, root: Path) -> dict[str, Any]:
    wd = root / name
    base = {
        "job_id": f"bench-{name}",
        "model": MODEL,
        "data": DATA,
        "training": {"steps": steps, "local_batch": 8, "lr": 3e-3, "warmup": 20, "seed": 7},
        "checkpoint": {"dir": None},
    }
    sync = {**sync, "links": links(mbps, 50.0), "timeout_s": 30.0}
    cfgs = region_configs(base, REGIONS, sync, wd)
    for r, c in cfgs.items():
        c["checkpoint"] = {"dir": str(wd / r / "ckpt"), "resume": False}
    t0 = time.monotonic()
    procs = run_regions(cfgs, wd, timeout=patience(900.0))
    elapsed = time.monotonic() - t0
    rows, transfers = [], []
    for r, p in procs.items():
        m = p.metrics()
        if p.result() is None or len(m) != steps:
            raise RuntimeError(f"{name}/{r} did not finish:\n{p.output()[-3000:]}")
        rows.append(m)
        for x in m:
            transfers += x.get("sync", {}).get("transfers", [])
    timed = [x for m in rows for x in m if x["step"] > 1]  # step 1 waits for the slowest region to start
    wall = sum(x["wall_s"] for x in timed)
    sent = sum(sum(x.get("sync", {}).get("bytes_sent", {}).values()) for m in rows for x in m)
    losses = [eval_loss(wd / r / "ckpt", wd / r) for r in REGIONS]
    return {
        "mode": name,
        "link_mbps": mbps,
        "steps": steps,
        "elapsed_s": elapsed,
        "step_s": wall / len(timed),
        "utilization": 1 - sum(x["sync_s"] for x in timed) / wall,
        "compute_only": sum(x["compute_s"] for x in timed) / wall,
        "wan_bytes": sent,
        "loss": sum(losses) / len(losses),
        "loss_spread": max(losses) - min(losses),
        "floor": rows[0][-1]["entropy_floor"],
        "events": [e for m in rows for x in m for e in x.get("sync", {}).get("events", [])],
    }


def goodput_probe(mbps: float = 100.0, ms: float = 50.0, nbytes: int = 4 << 20) -> float:
    """Push ``nbytes`` of fp32 over one shaped link between two real servers; receiver-side
    goodput (bytes over time from first data byte sent to last byte decoded) / shaped rate."""
    cfg = SyncConfig(links={"a|b": LinkSpec(bandwidth_mbps=mbps, latency_ms=ms)}, chunk_bytes=1 << 20)
    received: list[int] = []

    class Sink:
        region = "b"

        def known(self, region: str) -> bool:
            return True

        def handle_push(self, msg):  # noqa: ANN001, ANN201
            from training.sync.messages import PushResult

            received.append(msg.nbytes)
            return PushResult(True)

    shaper, stats = LinkShaper(cfg.links), TransferStats()
    server = SyncServer(Sink(), shaper, stats)  # type: ignore[arg-type]
    server.start()
    try:
        client = PeerClient("a", "b", server.address, LinkShaper(cfg.links), TransferStats())
        enc = encode_tensor(torch.randn(nbytes // 4), get_codec("fp32"), cfg.chunk_bytes)
        client.push(OutMessage(Meta("a", "probe"), [("x", enc)]), timeout=60)
        client.close()
    finally:
        server.stop()
    ((n, seconds, rate),) = stats.take()["transfers"]
    return (n / seconds) / rate


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--only", nargs="*", help="run only these modes (by table name)")
    args = ap.parse_args()
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, _mode, sync, mbps in modes(args.steps):
            if args.only and name not in args.only:
                continue
            results[name] = run_mode(name, sync, mbps, args.steps, Path(tmp))
            print(f"  done {name}: {results[name]['elapsed_s']:.0f}s", file=sys.stderr, flush=True)
    goodput = goodput_probe()
    floor = next(iter(results.values()))["floor"]
    ref = results.get("sync")
    print(f"\n3 regions x 1 CPU worker, tiny GPT {MODEL}, {args.steps} steps, entropy floor {floor:.4f} nats")
    print(
        f"{'mode':<14}{'link':>7}{'step ms':>9}{'util':>7}{'compute':>9}{'WAN MB':>10}{'vs sync':>9}"
        f"{'loss':>8}{'gap':>8}{'>floor':>8}"
    )
    for name, r in results.items():
        base = results.get("sync@1G" if r["link_mbps"] == 1000 else "sync")
        ratio = base["wan_bytes"] / r["wan_bytes"] if base else float("nan")
        gap = (r["loss"] - base["loss"]) / base["loss"] if base else float("nan")
        print(
            f"{name:<14}{r['link_mbps']:>6.0f}M{1e3 * r['step_s']:>9.1f}{r['utilization']:>7.3f}"
            f"{r['compute_only']:>9.3f}{r['wan_bytes'] / 1e6:>10.3f}{ratio:>8.0f}x"
            f"{r['loss']:>8.4f}{gap:>+8.4f}{r['loss'] - floor:>+8.4f}"
        )
        if r["events"]:
            print(f"{'':<14}membership events: {r['events'][:4]}")
    print(f"goodput probe: 4 MiB over 100 Mbit/s + 50 ms: {goodput:.3f} of the shaped rate")
    d = results.get("diloco")
    summary = {
        "diloco_compute_utilization": d and round(d["utilization"], 4),
        "diloco_compute_only_utilization": d and round(d["compute_only"], 4),
        "diloco_wan_bytes_ratio": d and ref and round(ref["wan_bytes"] / d["wan_bytes"], 1),
        "diloco_loss_gap": d and ref and round((d["loss"] - ref["loss"]) / ref["loss"], 4),
        "goodput_fraction": round(goodput, 4),
        "entropy_floor": round(floor, 4),
        "loss": {k: round(v["loss"], 4) for k, v in results.items()},
        "step_ms": {k: round(1e3 * v["step_s"], 1) for k, v in results.items()},
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
