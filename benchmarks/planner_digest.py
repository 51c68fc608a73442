"""Digest of the planner's options on the benchmark's seeded quotes: run it on two revisions to
check that a change to the search's speed left its answers alone.

    python benchmarks/planner_digest.py [--quotes 30] [--sizes 10,100,1000] [--small 60] [--without grouping]

Plans the same job sequence as ``planner.py`` on each fleet size, and the small instances of its
optimality-gap check, then prints one JSON line: per fleet size (and ``small``) a SHA-256 over
every quote's options as JSON (or its NoFeasiblePlan message), plus per-quote digests so a
difference can be traced to its quote. The MILP keeps a wall-clock safety limit
(``milp.SAFETY_TIME_LIMIT_S``), so on a heavily loaded machine a quote that leans on it can
differ between runs of the same code: re-run that quote before blaming the change. ``--without``
leaves the named fields out of every option before digesting: a change that adds a field to some
options (the grouping bound of spanning options) can show that it changed nothing else.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import MODELS, fleet, job, small_instance  # noqa: E402

from contracts.errors import NoFeasiblePlan  # noqa: E402
from control_layer.planner import plan  # noqa: E402


def _digest(spec, snap, without: tuple[str, ...] = ()) -> str:
    try:
        dumped = [o.model_dump(mode="json") for o in plan(spec, snap)]
        for option in dumped:
            for name in without:  # "sync.loss_penalty": a field of a section
                *path, last = name.split(".")
                part = option
                for key in path:
                    part = part.get(key) or {}
                part.pop(last, None)
        text = json.dumps(dumped, sort_keys=True)
    except NoFeasiblePlan as exc:
        text = f"infeasible: {exc}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quotes", type=int, default=30)
    ap.add_argument("--sizes", default="10,100,1000")
    ap.add_argument("--small", type=int, default=60)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--without", default="", help="option fields left out, comma-separated (a.b: field b of section a)"
    )
    args = ap.parse_args()
    without = tuple(f for f in args.without.split(",") if f)
    per: dict[str, list[str]] = {}
    for n in [int(s) for s in args.sizes.split(",")]:
        snap = fleet(n, seed=args.seed)
        rng = np.random.default_rng(args.seed)
        per[str(n)] = [_digest(job(i % len(MODELS), rng), snap, without) for i in range(args.quotes)]
    per["small"] = [_digest(*small_instance(seed), without) for seed in range(args.small)]
    total = {k: hashlib.sha256("".join(v).encode()).hexdigest()[:16] for k, v in per.items()}
    print(json.dumps({"digest": total, "per_quote": per}))


if __name__ == "__main__":
    main()
