"""The agent's only NVML calls (``nvidia-ml-py``, imported here lazily): one reading of the node's
GPUs in ``agent.gpu_reading``'s JSON shape, and the XID events since the last one.

Everything decided from a reading lives in the pure modules beside it (gpu_reading, gpu_visible,
gpu_topology, gpu_health), tested on recorded readings; this file only records. A query a GPU
does not support (ECC on a consumer board, NVLink on a PCIe card, power on some MIG setups)
reads as its neutral value, not as an error. ``python -m agent.nvml`` prints a reading: the
way to record a fixture from a real node.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from contracts.errors import FailedPrecondition


def _or(default: Any, fn: Callable[..., Any], *args: Any) -> Any:
    import pynvml

    try:
        return fn(*args)
    except pynvml.NVMLError_NotSupported:
        return default
    except pynvml.NVMLError as exc:  # a query that fails on one board: neutral, as unsupported
        if "Not Supported" in str(exc) or "Unknown" in str(exc) or "Invalid Argument" in str(exc):
            return default
        raise


def _text(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _nvlink(h: Any) -> dict[str, int]:
    import pynvml

    active, version = 0, 0
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        if _or(0, pynvml.nvmlDeviceGetNvLinkState, h, link) == pynvml.NVML_FEATURE_ENABLED:
            active += 1
            version = max(version, _or(0, pynvml.nvmlDeviceGetNvLinkVersion, h, link))
    return {"version": version, "active_links": active}


def _mig(h: Any) -> dict[str, Any]:
    import pynvml

    current, _pending = _or((0, 0), pynvml.nvmlDeviceGetMigMode, h)
    if current != pynvml.NVML_DEVICE_MIG_ENABLE:
        return {"enabled": False, "instances": []}
    instances = []
    for k in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(h)):
        try:
            m = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
        except pynvml.NVMLError_NotFound:
            continue  # an index no instance is created at
        name = _text(pynvml.nvmlDeviceGetName(m))
        instances.append(
            {
                "uuid": _text(pynvml.nvmlDeviceGetUUID(m)),
                "profile": name.rsplit(" MIG ", 1)[-1],
                "memory_total": int(pynvml.nvmlDeviceGetMemoryInfo(m).total),
            }
        )
    return {"enabled": True, "instances": instances}


def _health(h: Any) -> dict[str, Any]:
    import pynvml

    unc = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    sbe = _or(
        [],
        pynvml.nvmlDeviceGetRetiredPages,
        h,
        pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
    )
    dbe = _or([], pynvml.nvmlDeviceGetRetiredPages, h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
    remap = _or((0, 0, 0, 0), pynvml.nvmlDeviceGetRemappedRows, h)
    return {
        "ecc": {
            "volatile_uncorrected": int(
                _or(0, pynvml.nvmlDeviceGetTotalEccErrors, h, unc, pynvml.NVML_VOLATILE_ECC)
            ),
            "aggregate_uncorrected": int(
                _or(0, pynvml.nvmlDeviceGetTotalEccErrors, h, unc, pynvml.NVML_AGGREGATE_ECC)
            ),
        },
        "retired_pages": {
            "single_bit": len(sbe),
            "double_bit": len(dbe),
            "pending": bool(_or(0, pynvml.nvmlDeviceGetRetiredPagesPendingStatus, h)),
        },
        "remapped_rows": {
            "correctable": int(remap[0]),
            "uncorrectable": int(remap[1]),
            "pending": bool(remap[2]),
            "failure": bool(remap[3]),
        },
    }


def _gpu(i: int, h: Any) -> dict[str, Any]:
    import pynvml

    mem = pynvml.nvmlDeviceGetMemoryInfo(h)
    util = _or(None, pynvml.nvmlDeviceGetUtilizationRates, h)
    return {
        "index": i,
        "uuid": _text(pynvml.nvmlDeviceGetUUID(h)),
        "name": _text(pynvml.nvmlDeviceGetName(h)),
        "pci_bus_id": _text(pynvml.nvmlDeviceGetPciInfo(h).busId),
        "memory_total": int(mem.total),
        "memory_used": int(mem.used),
        "pcie_gen": int(_or(0, pynvml.nvmlDeviceGetCurrPcieLinkGeneration, h)),
        "pcie_width": int(_or(0, pynvml.nvmlDeviceGetCurrPcieLinkWidth, h)),
        "nvlink": _nvlink(h),
        "mig": _mig(h),
        **_health(h),
        "utilization_gpu": util.gpu if util is not None else 0,
        "utilization_memory": util.memory if util is not None else 0,
        "power_mw": int(_or(0, pynvml.nvmlDeviceGetPowerUsage, h)),
        "power_limit_mw": int(_or(0, pynvml.nvmlDeviceGetEnforcedPowerLimit, h)),
        "temperature_c": int(_or(0, pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU)),
    }


class Nvml:
    """An initialised NVML session: readings, and the XID events since the previous one."""

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as exc:
            raise FailedPrecondition("NVML: the nvidia-ml-py package is not installed") from exc
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise FailedPrecondition(f"NVML: {exc} (no NVIDIA driver on this node?)") from exc
        self._pynvml = pynvml
        count = pynvml.nvmlDeviceGetCount()
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        self._events = pynvml.nvmlEventSetCreate()
        for h in self._handles:  # a board that cannot report XIDs reports none
            _or(None, pynvml.nvmlDeviceRegisterEvents, h, pynvml.nvmlEventTypeXidCriticalError, self._events)

    def close(self) -> None:
        self._pynvml.nvmlEventSetFree(self._events)
        self._pynvml.nvmlShutdown()

    def xid_events(self) -> list[dict[str, Any]]:
        """The XID events waiting now (none: at once)."""
        out = []
        while True:
            try:
                data = self._pynvml.nvmlEventSetWait_v2(self._events, 0)
            except self._pynvml.NVMLError_Timeout:
                return out
            uuid = _text(self._pynvml.nvmlDeviceGetUUID(data.device))
            out.append({"gpu_uuid": uuid, "xid": int(data.eventData), "at": time.time()})

    def read(self) -> dict[str, Any]:
        """One reading (``agent.gpu_reading.parse_reading``'s input), XID events since the last."""
        p, hs = self._pynvml, self._handles
        n = len(hs)
        nvlink = p.NVML_P2P_CAPS_INDEX_NVLINK
        return {
            "schema": 1,
            "driver_version": _text(p.nvmlSystemGetDriverVersion()),
            "gpus": [_gpu(i, h) for i, h in enumerate(hs)],
            "p2p_nvlink": [
                [
                    i != j and _or(1, p.nvmlDeviceGetP2PStatus, hs[i], hs[j], nvlink) == p.NVML_P2P_STATUS_OK
                    for j in range(n)
                ]
                for i in range(n)
            ],  # fmt: skip
            "pcie_ancestor": [
                [
                    0 if i == j else int(_or(50, p.nvmlDeviceGetTopologyCommonAncestor, hs[i], hs[j]))
                    for j in range(n)
                ]
                for i in range(n)
            ],
            "xid_events": self.xid_events(),
        }


def read_node() -> dict[str, Any]:
    """One reading in a session of its own (start-up)."""
    session = Nvml()
    try:
        return session.read()
    finally:
        session.close()


if __name__ == "__main__":
    print(json.dumps(read_node(), indent=1))
