"""What a GPU node's heartbeat says about each device: utilisation, memory, power, temperature and
health, from one NVML reading (pure; ``agent.gpu_watch`` takes the readings)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from agent.gpu_health import Verdict, node_reason, verdicts
from agent.gpu_reading import Gpu, NodeReading, XidEvent
from contracts.device_samples import DeviceSample
from contracts.registration import DeviceReport

GIB = 1024**3
MAX_XID_KEPT = 256  # XID events the watch remembers (a node's verdict outlives the event's reading)


@dataclass(frozen=True)
class GpuState:
    """The node's GPUs as of one reading: per-device samples, and what the health rules decided."""

    samples: tuple[DeviceSample, ...]
    node_health: str  # "": healthy; else why the node is to be cordoned


def _gpu_of(reading: NodeReading, uuid: str) -> Gpu | None:
    return next((g for g in reading.gpus if g.uuid == uuid or any(m.uuid == uuid for m in g.mig)), None)


def with_past_events(reading: NodeReading, past: Sequence[XidEvent]) -> NodeReading:
    """The reading with the XID events of earlier readings: NVML reports an event once, and a GPU
    that fell off the bus stays fallen until the node reboots."""
    events = (*past, *reading.xid_events)[-MAX_XID_KEPT:]
    return replace(reading, xid_events=tuple(events))


def gpu_state(reading: NodeReading, devices: Sequence[DeviceReport]) -> GpuState:
    """Samples for the node's CUDA devices (by UUID; a MIG instance reads as its GPU, which NVML
    samples as a whole) and the health rules' verdicts over every GPU of the node. A device fault
    found while the agent runs cordons the node, naming the device (the control plane keeps a
    device with allocation history in the node's inventory, so it cannot be withdrawn alone)."""
    found: list[Verdict] = verdicts(reading)
    out = []
    for d in devices:
        gpu = _gpu_of(reading, d.uuid) if d.uuid else None
        if gpu is None:
            continue
        reasons = [v.reason for v in found if v.scope == "device" and v.uuid == gpu.uuid]
        out.append(
            DeviceSample(
                index=d.index,
                utilization=gpu.utilization_gpu / 100.0,
                memory_used_gb=round(gpu.memory_used / GIB, 3),
                power_w=gpu.power_w,
                temperature_c=gpu.temperature_c,
                health="; ".join(reasons)[:500],
            )
        )
    return GpuState(tuple(out), node_reason(found))
