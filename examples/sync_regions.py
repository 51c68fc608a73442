"""cpn's cross-region sync in your own training loop: three "regions" (processes here) train one
small model, each on its own data, and end with what their sync mode promises: one model (sync,
local_sgd, diloco, gossip) or a bounded lag (ssp: no region ran more than ``staleness`` rounds
ahead of the slowest; async: each server answer landed at most one round after its update).

    python examples/sync_regions.py --mode diloco     # starts the three regions and checks them
    python examples/sync_regions.py --mode all        # every mode in turn, in the same three
    python examples/sync_regions.py --mode ssp --region b ...  # what each of them runs

The regions talk over loopback here. Across machines give each leader its routable ``listen`` /
``advertise`` and the job's TLS material (``tls_ca_pem``, ``tls_cert_pem``, ``tls_key_pem``, and an
``auth_secret``): without them the engine refuses any address off loopback unless the config says
``insecure=True`` (``docs/sync.md``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import socket
import subprocess
import sys
from typing import Any

import torch
from torch import nn

from training.sync import SyncConfig, create_engine

REGIONS = ["a", "b", "c"]
STEPS = 60
MODES: dict[str, dict[str, Any]] = {
    "sync": {},  # gradients averaged every step
    "ssp": {"every": 5, "staleness": 1},
    "local_sgd": {"every": 10},
    "diloco": {"every": 10, "compression": "int8"},
    "async": {"every": 5},
    "gossip": {"every": 5},
}
ONE_MODEL = {"sync", "local_sgd", "diloco", "gossip"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_region(mode: str, region: str, ports: dict[str, int]) -> None:
    torch.manual_seed(0)  # the same initial model everywhere...
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    theta0 = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gen = torch.Generator().manual_seed(REGIONS.index(region) + 1)  # ...different data per region
    w_true = torch.linspace(-1, 1, 8)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    cfg = SyncConfig(
        mode=mode,
        listen=f"127.0.0.1:{ports[region]}",
        peers={r: f"127.0.0.1:{p}" for r, p in ports.items()},
        timeout_s=30,
        **MODES[mode],
    )
    engine = create_engine(cfg, region=region, total_steps=STEPS, theta0=theta0)
    worst: dict[str, int] = {}  # the largest lag each bounded mode reported
    step = 0
    try:
        while step < engine.local_steps(STEPS):  # balanced rounds: this region's own step count
            step += 1
            x = torch.randn(64, 8, generator=gen)
            loss = nn.functional.mse_loss(model(x).squeeze(-1), x @ w_true)
            opt.zero_grad()
            loss.backward()
            if engine.syncs_gradients(step):  # sync: one gradient for every region
                engine.reduce_gradients(step, [p.grad for p in model.parameters()])  # in place
            opt.step()
            if engine.should_sync(step):
                params = [p.detach().clone() for p in model.parameters()]
                engine.after_step(step, params)  # in place
                with torch.no_grad():
                    for p, new in zip(model.parameters(), params, strict=True):
                        p.copy_(new)
            for key, value in engine.metrics().items():
                if key in ("ssp_ahead", "async_lag_rounds"):
                    worst[key] = max(worst.get(key, 0), value)
    finally:
        engine.close()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    digest = hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16]
    out = {
        "mode": mode,
        "region": region,
        "steps": step,
        "loss": round(loss.detach().item(), 4),
        "params": digest,
    }
    print(json.dumps(out | worst | {"totals": engine.totals()}), flush=True)


def promise_kept(mode: str, results: list[dict[str, Any]]) -> tuple[bool, str]:
    if mode in ONE_MODEL:
        same = len({r["params"] for r in results}) == 1
        return same, f"one model in every region: {same}"
    key, bound = ("ssp_ahead", MODES["ssp"]["staleness"]) if mode == "ssp" else ("async_lag_rounds", 1)
    seen = [r.get(key) for r in results]
    ok = all(v is not None and v <= bound for v in seen)
    return ok, f"{key} per region {seen}, bound {bound}: {ok}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=[*sorted(MODES), "all"], default="diloco")
    ap.add_argument("--region")
    ap.add_argument("--ports", help="JSON mode -> region -> port")
    args = ap.parse_args()
    modes = list(MODES) if args.mode == "all" else [args.mode]
    if args.region:
        ports = json.loads(args.ports)
        for mode in modes:  # one engine after another: each closes before the next starts
            run_region(mode, args.region, ports[mode])
        return
    ports = {m: {r: free_port() for r in REGIONS} for m in modes}
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--mode", args.mode, "--region", r, "--ports", json.dumps(ports)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for r in REGIONS
    ]
    outs = [p.communicate(timeout=300 * len(modes))[0] for p in procs]
    if any(p.returncode != 0 for p in procs):
        print("a region failed:", [p.returncode for p in procs])
        sys.exit(1)
    lines = [json.loads(line) for o in outs for line in o.strip().splitlines() if line.startswith("{")]
    kept = True
    for mode in modes:
        results = [r for r in lines if r["mode"] == mode]
        for r in results:
            print(r)
        ok, line = promise_kept(mode, results)
        print(f"{mode}: {line}")
        kept = kept and ok
    sys.exit(0 if kept else 1)


if __name__ == "__main__":
    main()
