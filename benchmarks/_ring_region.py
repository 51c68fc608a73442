"""One region of ``ring_overlap.py``: a DiLoCo engine's ring rounds, alone (BUSY 0), with the
WAN workload's training beside them in the same process (1: as DiLoCo's overlapped rounds run),
or in a process of its own (2: the same CPU work, no GIL shared).

    python benchmarks/_ring_region.py ME SETUP_JSON START_AT ROUNDS PERIOD_S BUSY OUT

Each round opens at ``START_AT + k * PERIOD_S`` (wall clock, shared by the regions of one host)
and reduces the workload's parameter count of float32 over the ring; per round it writes one JSON
line: when it opened and completed, and the region's veth tx bytes just before it opened.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import torch  # noqa: E402
from _wan_workload import BATCH, MODEL  # noqa: E402

from contracts.lifetime import die_with_parent, tied_env  # noqa: E402
from contracts.sync_config import SyncConfig  # noqa: E402
from training.models.gpt import GPT, GPTConfig  # noqa: E402
from training.sync.engine import create_engine  # noqa: E402


def tx_bytes() -> int:
    """This namespace's tx bytes over every interface but loopback."""
    total = 0
    for line in Path("/proc/self/net/dev").read_text().splitlines()[2:]:
        name, _, rest = line.partition(":")
        if name.strip() != "lo":
            total += int(rest.split()[8])
    return total


def train_beside(stop: threading.Event, steps: list[int]) -> None:
    """The WAN workload's training steps (forward, backward, AdamW) until ``stop``."""
    model = GPT(GPTConfig(**MODEL))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    while not stop.is_set():
        idx = torch.randint(0, MODEL["vocab"], (BATCH, MODEL["seq_len"] + 1), generator=gen)
        _, loss = model(idx[:, :-1], idx[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        steps[0] += 1


def main() -> int:
    die_with_parent()  # the benchmark's (``lab.popen`` ties us), or this region's (``--train``)
    if sys.argv[1:] == ["--train"]:  # the training beside, in a process of its own
        torch.set_num_threads(1)
        train_beside(threading.Event(), [0])
        return 0
    me, setup, start_at, rounds, period, busy, out = sys.argv[1:8]
    torch.set_num_threads(1)  # as a worker in a one-CPU slot runs
    # peers' addresses, and this region's TLS material and secret as the control plane gives them
    given = json.loads(Path(setup).read_text())
    addrs: dict[str, str] = given["peers"]
    cfg = SyncConfig(
        mode="diloco", every=20, peers=addrs, listen=addrs[me], advertise=addrs[me],
        timeout_s=60, land_on_arrival=False, balance=False, **given["sync"],
    )  # fmt: skip
    engine = create_engine(cfg, region=me, total_steps=1000)
    red = engine.strategy.reducers[0]
    n = GPT(GPTConfig(**MODEL)).num_params()
    x = torch.randn(n, generator=torch.Generator().manual_seed(sorted(addrs).index(me)))
    stop, steps = threading.Event(), [0]
    trainer = threading.Thread(target=train_beside, args=(stop, steps), daemon=True)
    if busy == "1":
        trainer.start()
    elif busy == "2":
        other = subprocess.Popen([sys.executable, __file__, "--train"], env=tied_env())
    engine.node.hello_all(False, 0, 0, time.monotonic() + 60)  # every peer's server is up
    with open(out, "w") as f:
        for k in range(int(rounds)):
            time.sleep(max(0.0, float(start_at) + k * float(period) - time.time()))
            tx, s0 = tx_bytes(), steps[0]
            t0 = time.time()
            red.reduce(k, x, 1.0, "", 1, 60.0)
            t1 = time.time()
            line = {"round": k, "opened": t0, "completed": t1, "tx_before": tx, "steps": steps[0] - s0}
            f.write(json.dumps(line) + "\n")
            f.flush()
        f.write(json.dumps({"round": int(rounds), "tx_before": tx_bytes()}) + "\n")
    stop.set()
    if trainer.is_alive():
        trainer.join()
    if busy == "2":
        other.kill()
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
