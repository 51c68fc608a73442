"""Worker entry point: ``torchrun --nproc-per-node N -m training.worker --config cfg.json``.

Every rank builds its share of the mesh, model, data and optimizer and runs the train loop; the
leader (rank 0) reports ``CPN_METRIC {json}`` per step and ``CPN_RESULT {json}`` at the end.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import sys
import time
from pathlib import Path

from contracts.errors import CpnError
from contracts.lifetime import die_with_parent
from contracts.worker_config import load_worker_config
from training.metrics import JsonLinesSink, emit_result
from training.outputs import finish_outputs
from training.parallel.init import compute_cleanup, compute_init
from training.runtime import build_trainer

SPAWNED_AT_ENV = "CPN_SPAWNED_AT"  # unix seconds at which the agent started this worker group


def spawned_at() -> float | None:
    try:
        value = float(os.environ.get(SPAWNED_AT_ENV, ""))
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None


def process_started_at() -> float | None:
    """Unix seconds at which this process started (from ``/proc``, to a clock tick); None elsewhere.
    After ``spawned_at``, the gap is the launcher's part of the start-up."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


def main(argv: list[str] | None = None) -> int:
    die_with_parent()  # a worker a benchmark starts itself, tied to it (under an agent, its keeper is)
    parser = argparse.ArgumentParser(prog="python -m training.worker", description=__doc__)
    parser.add_argument("--config", help="worker config JSON (default: env CPN_WORKER_CONFIG)")
    args = parser.parse_args(argv)
    try:
        cfg = load_worker_config(args.config)
    except CpnError as e:
        print(f"CPN_ERROR {e.message}", file=sys.stderr, flush=True)
        return 2
    ctx = compute_init(cfg.device, store_secret=cfg.group.store_secret if cfg.group is not None else None)
    ok = False
    try:
        trainer = build_trainer(cfg, ctx)
        try:
            resumed = trainer.maybe_resume()
            if resumed and ctx.is_leader:
                source = "checkpoint" if trainer.checkpoint_step == trainer.step else "the peers' model"
                print(f"resumed from step {trainer.step} ({source})", flush=True)
            sink = None
            if ctx.is_leader:
                sink = JsonLinesSink(cfg.metrics_path, min_interval_s=cfg.metrics_interval_s)
            # Everything built so far (torch, gRPC, the model) lives as long as the process: out of
            # the collector's sight, a full collection in the train loop scans only what the loop
            # made (~310,000 objects before: 0.3-0.4 s a collection on a loaded 2-core host).
            gc.collect()
            gc.freeze()
            result = trainer.run(sink, spawned_at=spawned_at(), started_at=process_started_at())
            if sink is not None:
                sink.flush()  # the last step, if the interval held it back
            if trainer.preempted and ctx.is_leader:
                print(f"preempted after step {trainer.step} (checkpoint {trainer.checkpoint_step})")
        finally:
            t_close = time.perf_counter()
            trainer.close()  # the final exchange and leaving the peers
        result["final_sync_s"] = time.perf_counter() - t_close
        result.update(trainer.sync_totals())  # WAN bytes of the whole run, the final exchange included
        if not trainer.preempted:  # the final model (and its eval loss): a preempted run has none yet
            finish_outputs(trainer, result)
        if ctx.is_leader:
            emit_result(result)
        ok = True
    except CpnError as e:
        print(f"CPN_ERROR rank {ctx.rank}: {e.message}", file=sys.stderr, flush=True)
        return 2
    finally:
        compute_cleanup(ok)
    return 0


if __name__ == "__main__":
    sys.exit(main())
