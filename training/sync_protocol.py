"""The seam between the intra-cluster train loop and the cross-region sync engine: what both sides
agree on, in a module of its own so that neither imports the other.

Per step, after backward and before the optimizer step, on EVERY rank (synchronous mode only):

    if sync.syncs_gradients(step):                    # same answer on every rank
        grads = gather_full_grads(model, dims)        # leader: the cluster's averaged gradients
        sync.reduce_gradients(step, grads)            # leader: averaged with the other regions
        scatter_full_grads(model, dims, grads)        # every rank steps on the same gradient

Then, after the local optimizer step, the train loop (``training.runtime``) does on EVERY rank:

    if sync.should_sync(step):                        # same answer on every rank (collectives follow)
        params = gather_full_params(model, dims)      # leader: full replica, CPU, canonical order
        sync.after_step(step, params)                 # leader: gRPC with peer leaders, updates in place
        scatter_full_params(model, dims, params)      # leader's values -> every rank's shards
    metrics["sync"] = sync.metrics()                  # leader only; merged into the step's metrics

Contract for an engine (implemented in ``training.sync``, chosen by ``training.sync_hook.build_sync``):
- It is constructed on every rank; only the leader (global rank 0 of the torchrun group,
  ``ctx.is_leader``) opens sockets. On other ranks ``after_step`` receives ``[]`` and must return at
  once without any collective: the runtime broadcasts the leader's result itself.
- ``model_params`` on the leader: one contiguous float CPU tensor per parameter of the whole replica
  (all TP shards, FSDP shards and pipeline stages gathered), in the order of ``ctx.param_names``. The
  engine leaves its result in those tensors, in place. Tensors are fresh copies, so an engine may keep
  references (e.g. DiLoCo's outer-step anchor) only if it copies them first.
- ``should_sync`` must be a pure function of ``step`` (and config): every rank calls it and takes
  part in the gather/scatter collectives when it is True.
- ``state_dict``/``load_state_dict`` carry the engine's own state (outer optimizer, error feedback...)
  through checkpoints; the leader saves it beside the model checkpoint and loads it on resume
  (called on the leader only). Values may be tensors, numbers, strings, lists and dicts;
  ``state_dict`` returns copies (a checkpoint written in the background keeps them).
- ``metrics`` returns what happened since the last call, e.g. ``{"bytes_sent": {region: n},
  "bytes_recv": {region: n}, "latency_s": x}``; called on the leader every step. Its
  ``wire_bytes_sent_total``, where present, is a running total instead: the bytes the leader's
  sync sockets put on the wire, from the kernel's counters (``training.wan.wire_count``).
- ``local_steps(planned)``: how many steps this region runs (``planned``, the job's, unless rounds
  are balanced: then its own, which may grow while it runs; the loop asks after every step);
  ``job_step(step)``: where ``step`` is on the job's step axis, which the LR schedule follows.
- ``totals`` (after ``close``, on the leader): the run's totals for the result, e.g.
  ``{"wan_bytes_sent": n, "wan_wire_bytes_sent": n}``; ``{}`` where nothing crossed a WAN.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from torch import Tensor


@dataclass(frozen=True)
class SyncContext:
    """What an engine may know about the cluster it runs in."""

    job_id: str
    region: str
    cluster: str
    is_leader: bool
    rank: int
    world_size: int
    local_replicas: int  # data-parallel replicas this cluster trains (weight for averaging)
    global_replicas: int
    replica_offset: int
    param_names: tuple[str, ...]
    param_shapes: tuple[tuple[int, ...], ...]


@runtime_checkable
class CrossRegionSync(Protocol):
    def should_sync(self, step: int) -> bool: ...

    def syncs_gradients(self, step: int) -> bool: ...

    def reduce_gradients(self, step: int, grads: list[Tensor]) -> None: ...

    def after_step(self, step: int, model_params: list[Tensor]) -> None: ...

    def metrics(self) -> dict[str, Any]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def close(self) -> None: ...

    def totals(self) -> dict[str, int]: ...
    def local_steps(self, planned: int) -> int: ...
    def job_step(self, step: int) -> float: ...
