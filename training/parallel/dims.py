"""Parallel degrees inside one cluster, validated once, and the DeviceMesh they describe.

World ranks are laid out (pp, dp, tp), tp fastest: a TP group is adjacent ranks (the same node on
GPUs), and global rank 0 (the cluster leader) is pipeline stage 0, replica 0, TP rank 0. The mesh
carries one more dimension, ``dp_shard`` of size 1, between dp and tp: with it FSDP2 can run as
pure replication (HSDP with nothing to shard), which is how zero=0 composes with TP.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from contracts.errors import FailedPrecondition, InvalidArgument
from contracts.model import GPTConfig


@dataclass
class ParallelDims:
    dp: int
    tp: int
    pp: int
    world_size: int
    zero: int = 0
    pp_schedule: str = "1f1b"
    microbatches: int = 1
    _mesh: DeviceMesh | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "world_size", "microbatches"):
            if getattr(self, name) < 1:
                raise InvalidArgument(f"{name} must be >= 1, got {getattr(self, name)}", field=name)
        if self.dp * self.tp * self.pp != self.world_size:
            raise InvalidArgument(
                f"world size {self.world_size} != dp_local ({self.dp}) x tp ({self.tp}) x pp ({self.pp})"
                f" = {self.dp * self.tp * self.pp}: launch exactly that many processes",
                field="parallel",
                world_size=self.world_size,
                dp=self.dp,
                tp=self.tp,
                pp=self.pp,
            )
        if self.zero not in (0, 1, 2, 3):
            raise InvalidArgument(
                f"parallel.zero must be 0, 1, 2 or 3, got {self.zero}", field="parallel.zero"
            )
        if self.pp_schedule not in ("1f1b", "gpipe"):
            raise InvalidArgument(f"unknown pp_schedule {self.pp_schedule!r}", field="parallel.pp_schedule")
        if self.pp > 1 and self.microbatches < self.pp:
            raise InvalidArgument(
                f"parallel.microbatches ({self.microbatches}) must be >= pp ({self.pp}) to fill the pipeline",
                field="parallel.microbatches",
            )

    def check_model(self, cfg: GPTConfig) -> None:
        """Model shapes must split evenly over the degrees."""
        if cfg.n_heads % self.tp:
            raise InvalidArgument(
                f"model.n_heads ({cfg.n_heads}) must be divisible by tp ({self.tp})", field="model.n_heads"
            )
        if (cfg.mlp_ratio * cfg.d_model) % self.tp:
            raise InvalidArgument(
                f"MLP width ({cfg.mlp_ratio * cfg.d_model}) must be divisible by tp ({self.tp})",
                field="model.d_model",
            )
        if cfg.n_layers < self.pp:
            raise InvalidArgument(
                f"model.n_layers ({cfg.n_layers}) must be >= pp ({self.pp}): each stage needs a layer",
                field="model.n_layers",
            )

    @property
    def dp_enabled(self) -> bool:
        return self.dp > 1

    @property
    def fsdp(self) -> bool:
        return self.zero >= 1

    def build_mesh(self, device_type: str) -> DeviceMesh:
        self._mesh = init_device_mesh(
            device_type, (self.pp, self.dp, 1, self.tp), mesh_dim_names=("pp", "dp", "dp_shard", "tp")
        )
        return self._mesh

    @property
    def mesh(self) -> DeviceMesh:
        if self._mesh is None:
            raise FailedPrecondition("ParallelDims.build_mesh() has not been called")
        return self._mesh

    @property
    def pp_rank(self) -> int:
        return self.mesh.get_local_rank("pp")

    @property
    def dp_rank(self) -> int:
        return self.mesh.get_local_rank("dp")

    @property
    def tp_rank(self) -> int:
        return self.mesh.get_local_rank("tp")

    def stage_leader(self, stage: int) -> int:
        """Global rank of (pp=stage, dp=0, tp=0)."""
        return stage * self.dp * self.tp
