"""A Slurm cluster's nodes and what is free on them now, from ``sinfo`` and
``scontrol show node -o``: the devices a Slurm-backed agent registers for its cluster, and how
many of them are not cpn's to use at the moment.

The agent registers the slots of the nodes that take jobs (CPUs, or GRES GPUs where the cluster
has any). The cluster's own users keep submitting, so what cpn may use is what is free, not what
exists: on each heartbeat the agent re-reads the nodes and reports how many registered slots are
unavailable now (held by other users' jobs, or on nodes drained or down since). A device here is
a slot Slurm hands out, not a particular GPU: Slurm binds the job to devices of its choice when it
starts it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agent.slurm_cli import parse_record, slurm
from contracts.registration import DeviceReport

# Node states in which a node takes no new job (a base state, or a flag after '+').
UNUSABLE = frozenset({"DOWN", "DRAIN", "DRAINING", "DRAINED", "FAIL", "FAILING", "FUTURE", "MAINT",
                      "NOT_RESPONDING", "POWERED_DOWN", "POWERING_DOWN", "REBOOT_ISSUED", "RESERVED",
                      "UNKNOWN", "INVALID_REG", "INVALID"})  # fmt: skip
UNDECLARED_CPU_MEMORY_GB = 1.0  # per CPU slot, where the cluster declares no node memory
_GPU = re.compile(r"(?:^|,)gpu(?::(?P<model>[^:(,]+))?:(?P<count>\d+)")


@dataclass(frozen=True)
class SlurmNode:
    name: str
    states: frozenset[str]
    cpus: int
    cpus_allocated: int
    memory_mb: int
    gpus: int
    gpus_used: int
    gpu_model: str

    @property
    def usable(self) -> bool:
        return not (self.states & UNUSABLE)

    @property
    def free_cpus(self) -> int:
        return max(0, self.cpus - self.cpus_allocated) if self.usable else 0

    @property
    def free_gpus(self) -> int:
        return max(0, self.gpus - self.gpus_used) if self.usable else 0


def gres_gpus(text: str) -> tuple[str, int]:
    """(model, count) of the GPUs in a GRES string: ``gpu:a100:4(S:0-1)``, ``gpu:2``, ``(null)``."""
    model, count = "", 0
    for m in _GPU.finditer(text):
        if not m.group("count").isdigit():
            continue
        count += int(m.group("count"))
        model = model or (m.group("model") or "")
    return model, count


def node_from_record(record: dict[str, str]) -> SlurmNode:
    model, gpus = gres_gpus(record.get("Gres", ""))
    _, used = gres_gpus(record.get("GresUsed", ""))
    return SlurmNode(
        name=record.get("NodeName", ""),
        states=frozenset(s for s in re.split(r"[+*~#!%$@^-]", record.get("State", "UNKNOWN")) if s),
        cpus=int(record.get("CPUTot", "0") or 0),
        cpus_allocated=int(record.get("CPUAlloc", "0") or 0),
        memory_mb=int(record.get("RealMemory", "0") or 0),
        gpus=gpus,
        gpus_used=used,
        gpu_model=model,
    )


async def cluster_nodes(partition: str = "") -> list[SlurmNode]:
    """The nodes of ``partition`` ('' : every partition), as the controller sees them now."""
    names_argv = ["sinfo", "-h", "-N", "-o", "%N"] + ([f"--partition={partition}"] if partition else [])
    names = set((await slurm(*names_argv)).split())
    out = await slurm("scontrol", "show", "node", "-o")
    nodes = [node_from_record(parse_record(line)) for line in out.splitlines() if line.strip()]
    return sorted((n for n in nodes if n.name in names), key=lambda n: n.name)


def _gpu_slots(nodes: list[SlurmNode]) -> bool:
    return any(n.gpus for n in nodes)


def slot_count(nodes: list[SlurmNode]) -> int:
    """The slots of the nodes that take jobs (GPUs where the cluster has any, else CPUs); with
    none taking jobs, every node's: Slurm queues cpn's tasks until one does."""
    if _gpu_slots(nodes):
        return sum(n.gpus for n in nodes if n.usable) or sum(n.gpus for n in nodes)
    return sum(n.cpus for n in nodes if n.usable) or sum(n.cpus for n in nodes)


def free_slots(nodes: list[SlurmNode]) -> int:
    """The slots free now: idle GPUs (or CPUs) of nodes that take jobs."""
    if _gpu_slots(nodes):
        return sum(n.free_gpus for n in nodes)
    return sum(n.free_cpus for n in nodes)


def unavailable_slots(nodes: list[SlurmNode], *, registered: int, held: int) -> int:
    """How many of the ``registered`` slots are not cpn's to use now: all but those free and the
    ``held`` ones cpn's own started jobs occupy (Slurm counts those as allocated; cpn already
    counts them busy). A pending cpn job holds nothing in Slurm and is busy in cpn already."""
    return max(0, registered - free_slots(nodes) - held)


def slot_devices(
    nodes: list[SlurmNode], *, cpu_tflops: float, gpu_memory_gb: float, gpu_tflops: float
) -> list[DeviceReport]:
    """The slots the agent registers (``slot_count``): GPUs where the cluster has any, of the
    declared figures, else CPU slots."""
    if _gpu_slots(nodes):
        model = next((n.gpu_model for n in nodes if n.gpu_model), "") or "gpu"
        return [DeviceReport(i, model, gpu_memory_gb, gpu_tflops, "cuda") for i in range(slot_count(nodes))]
    count = slot_count(nodes)
    # Slurm's RealMemory defaults to 1 (MB): such a node declared none.
    per_cpu_gb = [n.memory_mb / 1024 / n.cpus for n in nodes if n.cpus and n.memory_mb > 1]
    memory = max(0.01, round(min(per_cpu_gb), 2)) if per_cpu_gb else UNDECLARED_CPU_MEMORY_GB
    return [DeviceReport(i, "cpu", memory, cpu_tflops, "cpu") for i in range(count)]
