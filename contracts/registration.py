"""What an agent declares when it registers, and the pure checks that declaration must pass.

Every problem is collected (not just the first), each naming its field, so an operator fixing a
node's flags sees everything wrong at once. Nothing here touches the database.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from contracts.errors import InvalidArgument

NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
PROVIDER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._-]{0,127}")
JURISDICTION_RE = re.compile(r"[A-Z0-9][A-Z0-9-]{0,15}")
HOST_RE = re.compile(r"[A-Za-z0-9.:\[\]_-]{1,255}")
DEVICE_KINDS = ("cuda", "cpu")


@dataclass(frozen=True)
class DeviceReport:
    """One accelerator (or declared CPU slot) as the node measured it."""

    index: int
    model: str
    memory_gb: float
    measured_tflops: float
    kind: str


@dataclass(frozen=True)
class NodeRegistration:
    region: str
    cluster: str
    devices: tuple[DeviceReport, ...]
    price_per_device_hour: float
    advertise_host: str
    sync_port_min: int
    sync_port_max: int
    enrollment_token: str = ""
    provider: str = ""
    hostname: str = ""
    spot_price_per_device_hour: float = 0.0  # 0 = no spot offer
    agent_version: str = ""
    intra_bandwidth_gbps: float = 0.0  # 0 = not measured; the cluster keeps its value
    jurisdiction: str = ""
    # Set together when a node that already holds credentials re-registers.
    node_id: str = ""
    node_token: str = ""
    probe_port: int = 0  # its LinkProbeService on advertise_host; 0: none


def _finite(x: float) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


def device_problems(
    devices: tuple[DeviceReport, ...] | list[DeviceReport], where: str = "devices"
) -> list[str]:
    problems: list[str] = []
    if not devices:
        problems.append(f"{where}: at least one device is required")
    seen: set[int] = set()
    for i, d in enumerate(devices):
        at = f"{where}[{i}]"
        if d.index < 0:
            problems.append(f"{at}.index: must be >= 0, got {d.index}")
        elif d.index in seen:
            problems.append(f"{at}.index: duplicate device index {d.index}")
        seen.add(d.index)
        if not d.model.strip() or len(d.model) > 128:
            problems.append(f"{at}.model: must be 1-128 characters, got {d.model!r}")
        if not (_finite(d.memory_gb) and d.memory_gb > 0):
            problems.append(f"{at}.memory_gb: must be a finite number > 0, got {d.memory_gb}")
        if not (_finite(d.measured_tflops) and d.measured_tflops > 0):
            problems.append(f"{at}.measured_tflops: must be a finite number > 0, got {d.measured_tflops}")
        if d.kind not in DEVICE_KINDS:
            problems.append(f"{at}.kind: must be one of {', '.join(DEVICE_KINDS)}, got {d.kind!r}")
    return problems


def registration_problems(reg: NodeRegistration) -> list[str]:
    """Every way ``reg`` is malformed, as ``field: reason`` strings (empty when it is fine)."""
    p: list[str] = []
    for name in ("region", "cluster"):
        value = getattr(reg, name)
        if not NAME_RE.fullmatch(value):
            p.append(f"{name}: must match [a-z0-9][a-z0-9-]{{0,62}}, got {value!r}")
    if reg.provider and not PROVIDER_RE.fullmatch(reg.provider):
        p.append(f"provider: must be 1-128 letters, digits, spaces or ._- , got {reg.provider!r}")
    if reg.jurisdiction and not JURISDICTION_RE.fullmatch(reg.jurisdiction):
        p.append(f"jurisdiction: must be 1-16 upper-case letters, digits or '-', got {reg.jurisdiction!r}")
    if len(reg.hostname) > 255:
        p.append("hostname: must be at most 255 characters")
    if len(reg.agent_version) > 32:
        p.append("agent_version: must be at most 32 characters")
    if not HOST_RE.fullmatch(reg.advertise_host):
        p.append(f"advertise_host: must be a host name or IP address, got {reg.advertise_host!r}")
    p.extend(device_problems(reg.devices))
    if not (_finite(reg.price_per_device_hour) and reg.price_per_device_hour >= 0):
        p.append(f"price_per_device_hour: must be a finite number >= 0, got {reg.price_per_device_hour}")
    if not (_finite(reg.spot_price_per_device_hour) and reg.spot_price_per_device_hour >= 0):
        p.append(
            f"spot_price_per_device_hour: must be a finite number >= 0, got {reg.spot_price_per_device_hour}"
        )
    if not (_finite(reg.intra_bandwidth_gbps) and reg.intra_bandwidth_gbps >= 0):
        p.append(f"intra_bandwidth_gbps: must be a finite number >= 0, got {reg.intra_bandwidth_gbps}")
    lo, hi = reg.sync_port_min, reg.sync_port_max
    if not (1024 <= lo <= hi <= 65535):
        p.append(f"sync_port_min/sync_port_max: need 1024 <= min <= max <= 65535, got {lo}-{hi}")
    if reg.probe_port != 0 and not 1024 <= reg.probe_port <= 65535:
        p.append(f"probe_port: need 0 (none) or 1024..65535, got {reg.probe_port}")
    if bool(reg.node_id) != bool(reg.node_token):
        p.append("node_id/node_token: re-registration needs both or neither")
    return p


def validate_registration(reg: NodeRegistration) -> None:
    """Raise ``InvalidArgument`` listing every malformed field of ``reg``."""
    problems = registration_problems(reg)
    if problems:
        raise InvalidArgument("invalid registration: " + "; ".join(problems), problems=problems)
