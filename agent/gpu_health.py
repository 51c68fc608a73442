"""Health rules over an NVML reading: which device, or the whole node, to cordon and why.

A rule that fires names the device by UUID and says what NVML reported, so the operator reads the
reason and knows the fix (a reset, a reboot, an RMA). Device faults take that device out of what
the node offers; a node fault (a GPU fell off the bus, XID 79) cordons the node, since the GPUs
beside it share the PCIe tree and NVSwitch fabric and the node needs a reboot. XIDs that users'
code causes (13, 31, 43, 45: illegal address, MMU fault, a killed context) cordon nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agent.gpu_reading import Gpu, NodeReading

# NVIDIA's XID catalogue: the hardware ones that make a device unsafe for the next job.
DEVICE_XIDS = {
    48: "double-bit ECC error",
    63: "row remapping recorded (reset pending)",
    64: "row remapping failed",
    74: "NVLink error",
    92: "high single-bit ECC error rate",
    94: "contained ECC error (reset needed)",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}
NODE_XIDS = {79: "GPU has fallen off the bus", 62: "internal micro-controller halt"}
# NVIDIA's guidance: a board that has retired this many pages (single + double bit) is due for
# replacement (Tesla/V100-era page retirement; A100 and later remap rows instead).
RETIRED_PAGES_LIMIT = 60


@dataclass(frozen=True)
class Verdict:
    scope: Literal["device", "node"]
    uuid: str  # the GPU the rule fired on
    reason: str


def _device_rules(g: Gpu) -> list[str]:
    out = []
    if g.ecc_volatile_uncorrected > 0:
        out.append(f"{g.ecc_volatile_uncorrected} uncorrectable ECC error(s) since the driver loaded")
    if g.retired_pending:
        out.append("retired pages pending: the GPU needs a reset")
    if g.retired_single_bit + g.retired_double_bit >= RETIRED_PAGES_LIMIT:
        out.append(
            f"{g.retired_single_bit + g.retired_double_bit} retired pages (limit {RETIRED_PAGES_LIMIT})"
        )
    if g.remap_failure:
        out.append("row remapping failed: the GPU needs replacing")
    elif g.remap_pending:
        out.append("row remapping pending: the GPU needs a reset")
    return out


def verdicts(reading: NodeReading) -> list[Verdict]:
    """Every rule that fires, device by device in NVML order, then the XID events in order."""
    out = [
        Verdict("device", g.uuid, f"GPU {g.index} ({g.uuid}): {why}")
        for g in reading.gpus
        for why in _device_rules(g)
    ]
    for e in reading.xid_events:
        gpu = reading.gpu_by_uuid(e.gpu_uuid)
        where = f"GPU {gpu.index} ({e.gpu_uuid})" if gpu else e.gpu_uuid
        if e.xid in NODE_XIDS:
            out.append(
                Verdict(
                    "node", e.gpu_uuid, f"{where}: XID {e.xid}, {NODE_XIDS[e.xid]}; the node needs a reboot"
                )
            )
        elif e.xid in DEVICE_XIDS:
            out.append(Verdict("device", e.gpu_uuid, f"{where}: XID {e.xid}, {DEVICE_XIDS[e.xid]}"))
    return out


def cordoned_uuids(found: list[Verdict]) -> set[str]:
    """The GPUs (or MIG parents) the node stops offering; a node rule cordons the node instead."""
    return {v.uuid for v in found if v.scope == "device"}


def node_reason(found: list[Verdict]) -> str:
    """The node's cordon reason ("" when no node rule fired): every node verdict, joined."""
    return "; ".join(v.reason for v in found if v.scope == "node")[:500]
