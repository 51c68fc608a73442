"""One reading of a node's NVIDIA GPUs as NVML reports it, in a plain JSON shape.

``agent.nvml`` (the only module that calls NVML) records a reading; everything else (which
devices the agent offers, their NVLink islands, their health, the heartbeat's telemetry) is
computed from it here and in the modules beside this one, so each is tested on recorded
readings of real node shapes (tests/agent/nvml_readings/). Parsing checks every field: a reading
from a driver that reports nonsense fails with the field named, it never reaches the planner.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from contracts.errors import InvalidArgument
from contracts.registration import DEVICE_UUID_RE as UUID_RE

SCHEMA = 1
MAX_GPUS = 64  # no node NVML enumerates has more; a reading beyond it is corrupt
MAX_MIG = 7  # instances one GPU can be split into (A100/H100/H200: 7)
# nvmlDeviceGetTopologyCommonAncestor's levels (nvmlGpuTopologyLevel_t): the closest common
# PCIe ancestor of two GPUs. 0: same board; 50: only across the CPUs' interconnect.
PCIE_LEVELS = {0: "internal", 10: "single switch", 20: "multiple switches", 30: "host bridge",
               40: "NUMA node", 50: "system"}  # fmt: skip


@dataclass(frozen=True)
class MigInstance:
    """A MIG instance: CUDA sees it as a device of its own, with its slice of the memory."""

    uuid: str
    profile: str  # e.g. "3g.40gb"
    memory_total: int


@dataclass(frozen=True)
class Gpu:
    index: int  # NVML's (PCI bus order), not CUDA's
    uuid: str
    name: str
    pci_bus_id: str
    memory_total: int
    memory_used: int
    pcie_gen: int
    pcie_width: int
    nvlink_version: int  # 0: no NVLink
    nvlink_active_links: int
    mig_enabled: bool
    mig: tuple[MigInstance, ...]
    ecc_volatile_uncorrected: int
    ecc_aggregate_uncorrected: int
    retired_single_bit: int
    retired_double_bit: int
    retired_pending: bool
    remapped_uncorrectable: int
    remap_pending: bool
    remap_failure: bool
    utilization_gpu: float  # percent
    utilization_memory: float  # percent
    power_w: float
    power_limit_w: float
    temperature_c: float


@dataclass(frozen=True)
class XidEvent:
    gpu_uuid: str
    xid: int
    at: float  # unix seconds


@dataclass(frozen=True)
class NodeReading:
    driver_version: str
    gpus: tuple[Gpu, ...]
    p2p_nvlink: tuple[tuple[bool, ...], ...]  # [i][j]: GPUs i and j reach each other over NVLink
    pcie_ancestor: tuple[tuple[int, ...], ...]  # [i][j]: PCIE_LEVELS key
    xid_events: tuple[XidEvent, ...]

    def gpu_by_uuid(self, uuid: str) -> Gpu | None:
        return next((g for g in self.gpus if g.uuid == uuid), None)


def _int(d: dict[str, Any], key: str, where: str, hi: float = 2**62) -> int:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= hi:
        raise InvalidArgument(f"{where}.{key}: expected an integer in [0, {hi:g}], got {v!r}")
    return v


def _num(d: dict[str, Any], key: str, where: str, hi: float) -> float:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or not 0 <= v <= hi:
        raise InvalidArgument(f"{where}.{key}: expected a number in [0, {hi:g}], got {v!r}")
    return float(v)


def _bool(d: dict[str, Any], key: str, where: str) -> bool:
    v = d.get(key)
    if not isinstance(v, bool):
        raise InvalidArgument(f"{where}.{key}: expected true or false, got {v!r}")
    return v


def _obj(d: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    v = d.get(key)
    if not isinstance(v, dict):
        raise InvalidArgument(f"{where}.{key}: expected an object, got {type(v).__name__}")
    return v


def _uuid(v: object, where: str) -> str:
    if not isinstance(v, str) or not UUID_RE.fullmatch(v):
        raise InvalidArgument(f"{where}: expected a GPU-/MIG- UUID, got {v!r}")
    return v


def _text(d: dict[str, Any], key: str, where: str) -> str:
    v = d.get(key)
    if not isinstance(v, str) or not 0 < len(v) <= 128:
        raise InvalidArgument(f"{where}.{key}: expected a string of 1 to 128 characters, got {v!r}")
    return v


def _mig(d: dict[str, Any], where: str) -> MigInstance:
    return MigInstance(
        uuid=_uuid(d.get("uuid"), f"{where}.uuid"),
        profile=_text(d, "profile", where),
        memory_total=_int(d, "memory_total", where),
    )


def _gpu(d: object, i: int) -> Gpu:
    where = f"gpus[{i}]"
    if not isinstance(d, dict):
        raise InvalidArgument(f"{where}: expected an object")
    nvlink, mig = _obj(d, "nvlink", where), _obj(d, "mig", where)
    ecc, retired, remap = (
        _obj(d, "ecc", where),
        _obj(d, "retired_pages", where),
        _obj(d, "remapped_rows", where),
    )
    instances = mig.get("instances")
    if not isinstance(instances, list) or len(instances) > MAX_MIG:
        raise InvalidArgument(f"{where}.mig.instances: expected a list of at most {MAX_MIG}")
    if _int(d, "index", where, MAX_GPUS - 1) != i:
        raise InvalidArgument(f"{where}.index: expected {i} (NVML's order), got {d.get('index')!r}")
    return Gpu(
        index=i,
        uuid=_uuid(d.get("uuid"), f"{where}.uuid"),
        name=_text(d, "name", where),
        pci_bus_id=_text(d, "pci_bus_id", where),
        memory_total=_int(d, "memory_total", where),
        memory_used=_int(d, "memory_used", where),
        pcie_gen=_int(d, "pcie_gen", where, 8),
        pcie_width=_int(d, "pcie_width", where, 32),
        nvlink_version=_int(nvlink, "version", f"{where}.nvlink", 16),
        nvlink_active_links=_int(nvlink, "active_links", f"{where}.nvlink", 64),
        mig_enabled=_bool(mig, "enabled", f"{where}.mig"),
        mig=tuple(_mig(m, f"{where}.mig.instances[{k}]") for k, m in enumerate(instances)),
        ecc_volatile_uncorrected=_int(ecc, "volatile_uncorrected", f"{where}.ecc"),
        ecc_aggregate_uncorrected=_int(ecc, "aggregate_uncorrected", f"{where}.ecc"),
        retired_single_bit=_int(retired, "single_bit", f"{where}.retired_pages"),
        retired_double_bit=_int(retired, "double_bit", f"{where}.retired_pages"),
        retired_pending=_bool(retired, "pending", f"{where}.retired_pages"),
        remapped_uncorrectable=_int(remap, "uncorrectable", f"{where}.remapped_rows"),
        remap_pending=_bool(remap, "pending", f"{where}.remapped_rows"),
        remap_failure=_bool(remap, "failure", f"{where}.remapped_rows"),
        utilization_gpu=_num(d, "utilization_gpu", where, 100),
        utilization_memory=_num(d, "utilization_memory", where, 100),
        power_w=_num(d, "power_mw", where, 1e8) / 1000,
        power_limit_w=_num(d, "power_limit_mw", where, 1e8) / 1000,
        temperature_c=_num(d, "temperature_c", where, 200),
    )


def _matrix(raw: object, n: int, name: str, cell: type) -> tuple[tuple[Any, ...], ...]:
    if not isinstance(raw, list) or len(raw) != n or any(not isinstance(r, list) or len(r) != n for r in raw):
        raise InvalidArgument(f"{name}: expected a {n}x{n} matrix")
    for i, row in enumerate(raw):
        for j, v in enumerate(row):
            ok = isinstance(v, bool) if cell is bool else (type(v) is int and v in PCIE_LEVELS)
            if not ok or row[j] != raw[j][i]:
                raise InvalidArgument(f"{name}[{i}][{j}]: expected a symmetric {cell.__name__}, got {v!r}")
    return tuple(tuple(r) for r in raw)


def parse_reading(raw: object) -> NodeReading:
    """A reading from its JSON shape (``agent.nvml.read_node``'s output); InvalidArgument names the field."""
    if not isinstance(raw, dict) or raw.get("schema") != SCHEMA:
        raise InvalidArgument(f"reading.schema: expected {SCHEMA}")
    gpus_raw = raw.get("gpus")
    if not isinstance(gpus_raw, list) or len(gpus_raw) > MAX_GPUS:
        raise InvalidArgument(f"gpus: expected a list of at most {MAX_GPUS}")
    gpus = tuple(_gpu(g, i) for i, g in enumerate(gpus_raw))
    if len({g.uuid for g in gpus} | {m.uuid for g in gpus for m in g.mig}) != len(gpus) + sum(
        len(g.mig) for g in gpus
    ):
        raise InvalidArgument("gpus: a UUID is listed twice")
    n = len(gpus)
    events = raw.get("xid_events", [])
    if not isinstance(events, list) or len(events) > 1024:
        raise InvalidArgument("xid_events: expected a list of at most 1024")
    xids = []
    for k, e in enumerate(events):
        if not isinstance(e, dict):
            raise InvalidArgument(f"xid_events[{k}]: expected an object")
        xids.append(
            XidEvent(
                gpu_uuid=_uuid(e.get("gpu_uuid"), f"xid_events[{k}].gpu_uuid"),
                xid=_int(e, "xid", f"xid_events[{k}]", 1 << 16),
                at=_num(e, "at", f"xid_events[{k}]", 1e11),
            )
        )
    return NodeReading(
        driver_version=_text(raw, "driver_version", "reading"),
        gpus=gpus,
        p2p_nvlink=_matrix(raw.get("p2p_nvlink"), n, "p2p_nvlink", bool),
        pcie_ancestor=_matrix(raw.get("pcie_ancestor"), n, "pcie_ancestor", int),
        xid_events=tuple(xids),
    )
