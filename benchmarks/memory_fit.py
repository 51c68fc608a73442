"""The planner's memory figure against torch's own accounting of the worker's code.

    python benchmarks/memory_fit.py [--options 320] [--seed 0] [--only "AC tp4"] [--rows]
                                    [--cache measured.pkl]

Draws option shapes the way ``benchmarks/plan_executes.py`` draws jobs (its ``random_spec``: tiny
models for CPU fleets, GPT shapes up to 4096 wide for GPU fleets, micro-batch, precision,
recomputation) and the degrees the planner chooses among (tp, pp with either schedule, ZeRO
0-3, replicas per torchrun group, replicas in all), then, for every pipeline stage of each, sets
the planner's figure (``cost_model.memory_per_device`` for the fullest stage, and the
``memory_model.stage_memory`` it takes the maximum of) beside what ``benchmarks/_memtrack.py``
measures when it runs the worker's own build and step under MemTracker. No plan is searched:
the figure is the cost model's for the shape, as the planner prices it.

Large models keep their width, heads, sequence and vocabulary but at most 4 layers (MemTracker's
time grows with the modules; fake tensors make the size free); DDP layouts run on real tensors
(``_memtrack.uses_ddp``), so they are drawn from the tiny models only; at most 4 micro-batches a
step (a longer step repeats itself and only takes longer to measure).

Compared per stage: weights, gradients and optimizer state (relative error, the worst of the
three), and activations (the step's peak above what stays between steps). An option whose
planned peak is more than 5 % under the measured one is an underestimate. Prints a table and a
final JSON line. ``--only`` measures only the drawn options whose kind (the table's first column)
has every word given, so a subset of a run is the very options that run drew; ``--rows`` prints
each option's stages, planned against measured. ``--cache`` keeps the measurements in a file
between runs, for trying changes to the rule only: a change to the worker's code makes it stale.
"""

from __future__ import annotations

import argparse
import json
import logging
import pickle
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks._memtrack import Layout, Measured, measure, uses_ddp  # noqa: E402
from benchmarks.plan_executes import random_spec  # noqa: E402
from contracts.job_spec import JobSpec  # noqa: E402
from contracts.model import model_config  # noqa: E402
from control_layer.planner import cost_model as cm  # noqa: E402
from control_layer.planner import memory_model  # noqa: E402

MAX_LAYERS = 4
MAX_MICRO = 4
UNDER = -0.05  # a planned peak this far under the measured one is an underestimate


@dataclass(frozen=True)
class Shape:
    """One option's shape: a job (resolved precision) and the degrees of its replicas."""

    spec: JobSpec
    tp: int
    pp: int
    zero: int
    dp_local: int
    dp: int
    schedule: str

    @property
    def n_micro(self) -> int:
        return self.spec.global_batch_sequences // self.dp // self.spec.training.micro_batch_size

    def harness(self, stage: int) -> Layout:
        t = self.spec.training
        return Layout(
            model=model_config(self.spec.model),
            tp=self.tp,
            pp=self.pp,
            zero=self.zero,
            dp_local=self.dp_local,
            micro_batch=t.micro_batch_size,
            microbatches=self.n_micro,
            precision=t.precision,
            activation_checkpointing=t.activation_checkpointing,
            pp_schedule=self.schedule,
            grad_clip=t.grad_clip or None,
            stage=stage,
        )

    def planned(self, stage: int) -> memory_model.Memory:
        t = self.spec.training
        layout = memory_model.Layout(
            tp=self.tp,
            pp=self.pp,
            zero=self.zero,
            shard_group=self.dp_local,
            n_micro=self.n_micro,
            micro_batch=t.micro_batch_size,
            precision=t.precision,
            activation_checkpointing=t.activation_checkpointing,
            schedule=self.schedule,
        )
        return memory_model.stage_memory(model_config(self.spec.model), layout, stage)

    def kind(self) -> str:
        t = self.spec.training
        parts = [
            "tiny" if self.spec.model.vocab < 1000 else "gpt",
            t.precision,
            "AC" if t.activation_checkpointing else "",
            f"tp{self.tp}" if self.tp > 1 else "",
            f"pp{self.pp}-{self.schedule}" if self.pp > 1 else "",
            f"zero{self.zero}" if self.zero else ("ddp" if self.dp_local > 1 and self.tp == 1 else ""),
            f"x{self.dp_local}" if self.dp_local > 1 else "",
        ]
        return " ".join(p for p in parts if p)


def _choice(rng: np.random.Generator, items: list) -> Any:
    return items[int(rng.integers(len(items)))]


def draw(rng: np.random.Generator) -> Shape:
    """An option shape as plan_executes' jobs and the planner's degrees make them."""
    while True:
        tiny = bool(rng.random() < 0.5)
        spec = random_spec(rng, tiny, ["r0"])
        if spec.entrypoint is not None:
            continue  # a bring-your-own model is not the GPT the planner prices
        model = spec.model.model_copy(update={"n_layers": min(spec.model.n_layers, MAX_LAYERS)})
        precision = spec.training.precision
        if precision == "auto":  # CPU fleets resolve it to fp32, GPU fleets to bf16
            precision = "fp32" if tiny else "bf16"
        training = spec.training.model_copy(update={"precision": precision})
        spec = spec.model_copy(update={"model": model, "training": training})
        heads, width = model.n_heads, 4 * model.d_model
        tp = int(_choice(rng, [t for t in (1, 2, 4) if heads % t == 0 and width % t == 0]))
        pp = int(_choice(rng, [p for p in (1, 2, 4) if p <= model.n_layers]))
        dp_local = int(_choice(rng, [1, 2, 4]))
        shape = Shape(
            spec=spec,
            tp=tp,
            pp=pp,
            zero=int(_choice(rng, [0, 1, 2, 3])),
            dp_local=dp_local,
            dp=dp_local * int(_choice(rng, [1, 2])),
            schedule=str(_choice(rng, ["1f1b", "gpipe"])),
        )
        sequences = spec.global_batch_sequences
        if sequences % (shape.dp * training.micro_batch_size) or not 1 <= shape.n_micro <= MAX_MICRO:
            continue
        if pp > 1 and shape.n_micro < pp:
            continue
        if uses_ddp(shape.harness(0)) and not tiny:
            continue  # DDP is measured on real tensors: tiny models only
        return shape


@dataclass(frozen=True)
class Compared:
    shape: Shape
    err_states: float  # the worst relative error of weights, gradients, optimizer state, any stage
    err_activations: float  # the largest in size, signed (planned over measured, less 1)
    err_peak: float  # planned fullest-stage peak over the measured fullest stage's, less 1


def _rel(planned: float, measured: float) -> float:
    return planned / measured - 1.0 if measured else 0.0


def compare(shape: Shape, measured: list[Measured]) -> Compared:
    states, acts = 0.0, 0.0
    for stage, got in enumerate(measured):
        plan = shape.planned(stage)
        terms = ((plan.weights, got.weights), (plan.grads, got.grads), (plan.optimizer, got.optimizer))
        states = max([states] + [abs(_rel(p, m)) for p, m in terms])
        a = _rel(plan.activations, got.activations)
        acts = a if abs(a) > abs(acts) else acts
    fullest = cm.memory_per_device(
        shape.spec, shape.tp, shape.pp, shape.zero, shape.dp_local, shape.n_micro, shape.schedule
    )
    return Compared(shape, states, acts, _rel(fullest.total, max(m.peak for m in measured)))


def _rows(r: Compared, measured: list[Measured]) -> None:
    """One option's stages, planned against measured (MiB): activations and the peak."""
    mb = r.shape.spec.training.micro_batch_size
    print(f"{r.shape.kind()}  n_micro {r.shape.n_micro}  mb {mb}  {r.shape.spec.model}")
    for stage, got in enumerate(measured):
        plan = r.shape.planned(stage)
        mib = 2**20
        print(
            f"    stage {stage}: activations {plan.activations / mib:10.3f} / {got.activations / mib:10.3f} "
            f"({_rel(plan.activations, got.activations):+.3f})  peak {plan.total / mib:10.3f} / "
            f"{got.peak / mib:10.3f} ({_rel(plan.total, got.peak):+.3f})"
        )


def _load(path: str | None) -> dict[Layout, Measured]:
    if path is None or not Path(path).exists():
        return {}
    with open(path, "rb") as f:
        return pickle.load(f)


def _table(results: list[Compared]) -> None:
    by_kind: dict[str, list[Compared]] = {}
    for r in results:
        by_kind.setdefault(r.shape.kind(), []).append(r)
    print(f"{'option kind':<40} {'n':>4} {'states':>8} {'activations':>12} {'peak':>8}")
    for kind in sorted(by_kind):
        rows = by_kind[kind]
        worst_a = max((r.err_activations for r in rows), key=abs)
        worst_p = min(r.err_peak for r in rows)
        print(
            f"{kind:<40} {len(rows):>4} {max(r.err_states for r in rows):>8.4f} "
            f"{worst_a:>+12.3f} {worst_p:>+8.3f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--options", type=int, default=320)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default="", help="measure only options whose kind has all these words")
    ap.add_argument("--rows", action="store_true", help="print every option's stages")
    ap.add_argument("--cache", default=None, help="keep measurements here between runs (rule changes only)")
    args = ap.parse_args()
    # DTensor warns, per collective, that two mesh dimensions could be flattened into one.
    logging.getLogger("torch.distributed.tensor").setLevel(logging.ERROR)
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    cached = _load(args.cache)
    seen: dict[Layout, Measured] = {}
    results: list[Compared] = []
    words = args.only.split()
    for drawn in range(1, args.options + 1):
        shape = draw(rng)
        if not set(words) <= set(shape.kind().split()):
            continue
        layouts = [shape.harness(s) for s in range(shape.pp)]
        for x in layouts:
            if x not in seen:
                seen[x] = cached[x] if x in cached else measure(x)
        measured = [seen[x] for x in layouts]
        results.append(compare(shape, measured))
        if args.rows:
            _rows(results[-1], measured)
        if drawn % 50 == 0:
            print(f"  {drawn} options drawn, {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    if args.cache is not None:
        with open(args.cache, "wb") as f:
            pickle.dump(cached | seen, f)
    if not results:
        print("no drawn option matches --only")
        return
    _table(results)
    under = [r for r in results if r.err_peak < UNDER]
    worst = sorted(results, key=lambda r: -abs(r.err_activations))[:5]
    print()
    for r in worst + under:
        errs = f"activations {r.err_activations:+.3f} peak {r.err_peak:+.3f}"
        print(f"{r.shape.kind():<40} {errs} {r.shape.spec.model}")
    print(f"{len(seen)} stages measured in {time.perf_counter() - t0:.0f} s")
    print(
        json.dumps(
            {
                "options_checked": len(results),
                "max_rel_err_states": round(max(r.err_states for r in results), 6),
                "max_rel_err_activations": round(max(abs(r.err_activations) for r in results), 4),
                "underestimates_over_5pct": len(under),
                "worst_peak_err": round(min(r.err_peak for r in results), 4),
                "stages_measured": len(seen),
                "seconds": round(time.perf_counter() - t0, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
