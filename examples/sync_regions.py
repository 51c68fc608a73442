"""cpn's cross-region sync in your own training loop: three "regions" (processes here) train one
small model with DiLoCo, each on its own data, and end with the same parameters.

    python examples/sync_regions.py                 # starts the three regions and checks them
    python examples/sync_regions.py --region b ...  # what each of them runs

Each region's leader serves on every interface (``listen``) and tells its peers where to reach it
(``advertise``); across machines, give each its routable host:port.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import socket
import subprocess
import sys

import torch
from torch import nn

from training.sync import SyncConfig, SyncEngine

REGIONS = ["a", "b", "c"]
STEPS = 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_region(region: str, ports: dict[str, int]) -> None:
    torch.manual_seed(0)  # the same initial model everywhere...
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    theta0 = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gen = torch.Generator().manual_seed(REGIONS.index(region) + 1)  # ...different data per region
    w_true = torch.linspace(-1, 1, 8)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    cfg = SyncConfig(
        mode="diloco",
        every=10,
        compression="int8",
        listen=f"0.0.0.0:{ports[region]}",
        advertise=f"127.0.0.1:{ports[region]}",
        peers={r: f"127.0.0.1:{p}" for r, p in ports.items()},
        timeout_s=30,
    )
    engine = SyncEngine(
        cfg, region=region, is_leader=True, total_steps=STEPS, weight=1 / len(REGIONS), theta0=theta0
    )
    try:
        for step in range(1, STEPS + 1):
            x = torch.randn(64, 8, generator=gen)
            loss = nn.functional.mse_loss(model(x).squeeze(-1), x @ w_true)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if engine.should_sync(step):
                params = [p.detach().clone() for p in model.parameters()]
                engine.after_step(step, params)  # in place
                with torch.no_grad():
                    for p, new in zip(model.parameters(), params, strict=True):
                        p.copy_(new)
            engine.metrics()
    finally:
        engine.close()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    digest = hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16]
    print(
        json.dumps({"region": region, "loss": round(loss.detach().item(), 4), "params": digest}), flush=True
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--region")
    ap.add_argument("--ports", help="JSON region -> port")
    args = ap.parse_args()
    if args.region:
        run_region(args.region, json.loads(args.ports))
        return
    ports = {r: free_port() for r in REGIONS}
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--region", r, "--ports", json.dumps(ports)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for r in REGIONS
    ]
    results = [json.loads(p.communicate(timeout=300)[0].strip().splitlines()[-1]) for p in procs]
    for r in results:
        print(r)
    same = len({r["params"] for r in results}) == 1
    print("one model in every region:", same)
    sys.exit(0 if same and all(p.returncode == 0 for p in procs) else 1)


if __name__ == "__main__":
    main()
