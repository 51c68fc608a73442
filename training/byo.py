"""Bring your own model: ``entrypoint = "package.module:function"``.

The function takes the ``WorkerConfig`` and returns a ``BYOJob`` (or a ``(model, dataset, loss_fn)``
tuple; a ``BYOJob`` may add an ``eval_dataset``): an ``nn.Module``, a map-style dataset whose items
are ``(input, target)`` pairs, and ``loss_fn(model(inputs), targets) -> scalar``. It is called after
``torch.manual_seed(training.seed)`` on every rank, so default initialisation is identical across
ranks. Data parallelism (DDP / FSDP2)
and cross-region sync apply as for the built-in GPT; TP and PP need the GPT's module structure.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset, default_collate

from contracts.errors import InvalidArgument
from training.data.streams import derive_seed

if TYPE_CHECKING:
    from contracts.worker_config import WorkerConfig


@dataclass
class BYOJob:
    model: nn.Module
    dataset: Dataset[Any]
    loss_fn: Callable[[Any, Tensor], Tensor]
    # Optional: held-out (input, target) pairs; the final model's mean loss on them is reported as
    # ``eval_loss`` (``training.outputs.evaluate``).
    eval_dataset: Dataset[Any] | None = None


def load_entrypoint(spec: str) -> Callable[[WorkerConfig], Any]:
    module_name, _, fn_name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise InvalidArgument(
            f"entrypoint module {module_name!r} cannot be imported: {e}", field="entrypoint"
        ) from e
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise InvalidArgument(
            f"entrypoint {spec!r}: {module_name} has no callable {fn_name!r}", field="entrypoint"
        )
    return fn


def build_byo(cfg: WorkerConfig) -> BYOJob:
    assert cfg.entrypoint is not None
    torch.manual_seed(cfg.training.seed)
    got = load_entrypoint(cfg.entrypoint)(cfg)
    job = BYOJob(*got) if isinstance(got, tuple) and len(got) == 3 else got
    if not isinstance(job, BYOJob):
        raise InvalidArgument(
            f"entrypoint {cfg.entrypoint!r} must return BYOJob or (model, dataset, loss_fn),"
            f" got {type(got).__name__}",
            field="entrypoint",
        )
    if not isinstance(job.model, nn.Module) or not callable(job.loss_fn):
        raise InvalidArgument(
            f"entrypoint {cfg.entrypoint!r}: model must be nn.Module, loss_fn callable", field="entrypoint"
        )
    if len(job.dataset) == 0:  # type: ignore[arg-type]
        raise InvalidArgument(f"entrypoint {cfg.entrypoint!r} returned an empty dataset", field="entrypoint")
    return job


class DatasetStream:
    """A map-style dataset sharded by replica: each epoch a seeded permutation, replica r takes every
    ``replicas``-th index from position r (as DistributedSampler). Batch ``step`` is a pure function
    of (seed, replica, step), so resume needs no saved position."""

    def __init__(
        self, dataset: Dataset[Any], seed: int, replica: int, replicas: int, batch_size: int
    ) -> None:
        n = len(dataset)  # type: ignore[arg-type]
        per_replica = n // replicas
        if per_replica < batch_size:
            raise InvalidArgument(
                f"dataset of {n} items gives each of {replicas} replicas {per_replica} < batch {batch_size}",
                field="training.local_batch",
            )
        self.dataset, self.seed, self.replica, self.replicas = dataset, seed, replica, replicas
        self.n, self.per_replica = n, per_replica
        self.batches_per_epoch = per_replica // batch_size

    def batch(self, step: int, batch_size: int) -> tuple[Any, Any]:
        epoch, pos = divmod(step, self.batches_per_epoch)
        perm = torch.randperm(self.n, generator=torch.Generator().manual_seed(derive_seed(self.seed, epoch)))
        mine = perm[self.replica : self.replicas * self.per_replica : self.replicas]
        idx = mine[pos * batch_size : (pos + 1) * batch_size]
        inputs, targets = default_collate([self.dataset[int(i)] for i in idx])
        return inputs, targets
