"""What a GPU node offers, from one NVML reading: the visible devices a health rule leaves, each
with its NVLink island, or the reason the whole node is cordoned."""

from __future__ import annotations

from dataclasses import dataclass

from agent import gpu_health
from agent.gpu_reading import NodeReading
from agent.gpu_topology import nvlink_islands
from agent.gpu_visible import GpuUnit, visible_units


@dataclass(frozen=True)
class Offer:
    units: tuple[GpuUnit, ...]  # in cpn device-index order
    islands: tuple[int, ...]  # each unit's NVLink island
    verdicts: tuple[gpu_health.Verdict, ...]  # every health rule that fired
    node_reason: str  # "": the node is healthy; else why it is cordoned (it offers nothing)


def offer(reading: NodeReading, cuda_visible: str | None) -> Offer:
    """The devices the agent registers. The health rules run over every GPU of the node (an XID 79
    on a GPU another agent owns still takes this node's PCIe tree down), then cordoned devices
    leave the visible ones; islands are numbered over what is left."""
    found = gpu_health.verdicts(reading)
    reason = gpu_health.node_reason(found)
    if reason:
        return Offer((), (), tuple(found), reason)
    cordoned = gpu_health.cordoned_uuids(found)
    units = [u for u in visible_units(reading, cuda_visible) if u.gpu.uuid not in cordoned]
    return Offer(tuple(units), tuple(nvlink_islands(reading, units)), tuple(found), "")
