"""Which CUDA devices this agent offers, named by UUID, from an NVML reading and the
``CUDA_VISIBLE_DEVICES`` the agent inherited.

An agent under Slurm, or one of several agents of a node, inherits a ``CUDA_VISIBLE_DEVICES``
that names its share (indices or UUIDs). Its workers must land on exactly those physical GPUs, so
the agent resolves the inherited list to UUIDs once and gives each worker the UUIDs of its
devices: a UUID names the same GPU whatever the worker's own enumeration order. Indices are NVML's
(PCI bus order), which is what Slurm's gres and ``nvidia-smi`` number; workers get
``CUDA_DEVICE_ORDER=PCI_BUS_ID`` too. A GPU in MIG mode offers each of its instances as a device.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.gpu_reading import Gpu, NodeReading
from contracts.errors import FailedPrecondition

GIB = 1024**3


@dataclass(frozen=True)
class GpuUnit:
    """One CUDA device as a worker sees it: a whole GPU or one MIG instance."""

    uuid: str  # what CUDA_VISIBLE_DEVICES names
    gpu: Gpu  # the physical GPU (a MIG instance's parent)
    name: str
    memory_total: int

    @property
    def is_mig(self) -> bool:
        return self.uuid.startswith("MIG-")

    @property
    def memory_gb(self) -> float:
        return round(self.memory_total / GIB, 2)


def units_of(gpu: Gpu) -> list[GpuUnit]:
    if not gpu.mig_enabled:
        return [GpuUnit(uuid=gpu.uuid, gpu=gpu, name=gpu.name, memory_total=gpu.memory_total)]
    return [GpuUnit(uuid=m.uuid, gpu=gpu, name=f"{gpu.name} MIG {m.profile}", memory_total=m.memory_total)
            for m in gpu.mig]  # fmt: skip


def _resolve(entry: str, reading: NodeReading, units: list[GpuUnit]) -> list[GpuUnit]:
    """The units one CUDA_VISIBLE_DEVICES entry names. CUDA takes a unique UUID prefix too."""
    if entry.isdigit():
        k = int(entry)
        if k >= len(reading.gpus):
            raise FailedPrecondition(
                f"CUDA_VISIBLE_DEVICES: index {k} is beyond this node's {len(reading.gpus)} GPU(s)"
            )
        gpu = reading.gpus[k]
        if gpu.mig_enabled:
            raise FailedPrecondition(
                f"CUDA_VISIBLE_DEVICES: GPU {k} is in MIG mode; name its instances by their MIG- UUIDs"
            )
        return units_of(gpu)
    if entry.startswith("GPU-"):
        gpus = [g for g in reading.gpus if g.uuid.startswith(entry)]
        if len(gpus) == 1:  # a MIG GPU's own UUID: CUDA offers its instances
            return units_of(gpus[0])
        raise FailedPrecondition(f"CUDA_VISIBLE_DEVICES: {entry!r} names no single GPU of this node")
    if entry.startswith("MIG-"):
        found = [u for u in units if u.is_mig and u.uuid.startswith(entry)]
        if len(found) == 1:
            return found
        raise FailedPrecondition(f"CUDA_VISIBLE_DEVICES: {entry!r} names no single MIG instance of this node")
    raise FailedPrecondition(f"CUDA_VISIBLE_DEVICES: expected indices or GPU-/MIG- UUIDs, got {entry!r}")


def visible_units(reading: NodeReading, cuda_visible: str | None) -> list[GpuUnit]:
    """The devices the agent may hand out, in the order it numbers them (cpn device indices).

    ``cuda_visible`` None (unset): every GPU, every MIG instance. Set: exactly what it names, in
    its order; a name that matches nothing, or one device named twice, stops the agent (CUDA would
    silently drop the rest of the list, and the agent would offer GPUs it cannot reach)."""
    units = [u for g in reading.gpus for u in units_of(g)]
    if cuda_visible is None:
        return units
    out: list[GpuUnit] = []
    for entry in (e.strip() for e in cuda_visible.split(",")):
        if not entry:
            continue
        for u in _resolve(entry, reading, units):
            if any(o.uuid == u.uuid for o in out):
                raise FailedPrecondition(f"CUDA_VISIBLE_DEVICES: {entry!r} names a device listed before")
            out.append(u)
    return out


def visible_value(uuids: list[str]) -> str:
    """A worker's CUDA_VISIBLE_DEVICES for its devices' UUIDs."""
    return ",".join(uuids)


def torch_ordinals(units: list[GpuUnit], torch_uuids: list[str]) -> list[int]:
    """For each unit, the torch ordinal of the agent's own process that is that device.

    torch reports ``get_device_properties(i).uuid`` without the GPU-/MIG- prefix; the agent's
    ordinals follow its inherited CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER, so they are matched
    by UUID, never assumed equal to NVML's indices."""
    bare = [u.removeprefix("GPU-").removeprefix("MIG-").lower() for u in torch_uuids]
    out = []
    for u in units:
        key = u.uuid.removeprefix("GPU-").removeprefix("MIG-").lower()
        if key not in bare:
            raise FailedPrecondition(
                f"device {u.uuid} ({u.name}) is not visible to torch in the agent's process"
            )
        out.append(bare.index(key))
    return out
