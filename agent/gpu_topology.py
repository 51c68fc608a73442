"""The NVLink islands among the devices an agent offers, and the peer bandwidth each device has.

An island is a set of devices that all reach each other over NVLink (directly, or through
NVSwitch, as NVML's P2P status says). The planner keeps a tensor-parallel group inside one island:
TP all-reduces every layer, and over PCIe it runs an order of magnitude slower. A MIG instance is
an island of its own (MIG instances have no peer access).
"""

from __future__ import annotations

from agent.gpu_reading import Gpu, NodeReading
from agent.gpu_visible import GpuUnit

# Per link, per direction, GB/s, by NVLink version (NVML's nvmlDeviceGetNvLinkVersion):
# V100 (2) 25, A100 (3) 25 over 12 links, H100/H200 (4) 25 over 18 links, B200 (5) 50 over 18.
NVLINK_GBYTES_PER_LINK = {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 5: 50.0}
# Per lane, per direction, GB/s after encoding, by PCIe generation.
PCIE_GBYTES_PER_LANE = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


def nvlink_islands(reading: NodeReading, units: list[GpuUnit]) -> list[int]:
    """Each unit's island, numbered 0.. in order of each island's first unit."""
    parent = list(range(len(units)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for a, ua in enumerate(units):
        for b in range(a + 1, len(units)):
            ub = units[b]
            if not ua.is_mig and not ub.is_mig and reading.p2p_nvlink[ua.gpu.index][ub.gpu.index]:
                parent[root(b)] = root(a)
    numbers: dict[int, int] = {}
    return [numbers.setdefault(root(i), len(numbers)) for i in range(len(units))]


def nvlink_gbytes_s(gpu: Gpu) -> float:
    """The GPU's NVLink bandwidth to its peers, per direction (0: none)."""
    return NVLINK_GBYTES_PER_LINK.get(gpu.nvlink_version, 0.0) * gpu.nvlink_active_links


def pcie_gbytes_s(gpu: Gpu) -> float:
    """The GPU's PCIe link to the host, per direction, at its current generation and width."""
    return PCIE_GBYTES_PER_LANE.get(gpu.pcie_gen, 0.0) * gpu.pcie_width


def peer_gbytes_s(units: list[GpuUnit], islands: list[int]) -> float:
    """What an all-reduce over all the units can reach per direction per device: NVLink where
    they form one island, else the slowest device's PCIe link (the ring crosses it)."""
    if not units:
        return 0.0
    if len(set(islands)) == 1 and not units[0].is_mig and len(units) > 1:
        return min(nvlink_gbytes_s(u.gpu) for u in units)
    return min(pcie_gbytes_s(u.gpu) for u in units)
