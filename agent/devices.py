"""Finding a node's devices and measuring what each can compute.

CUDA devices are found through NVML (``agent.nvml``) and named by UUID. The measured figure is
dense matmul throughput (TFLOPS), the number the planner's cost model divides work by. CUDA
devices run a bf16 (or fp16/fp32) matmul; CPU slots run a small fp32 matmul on one thread, since
each slot's worker runs with OMP_NUM_THREADS=1.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from agent.gpu_offer import offer
from agent.gpu_reading import parse_reading
from agent.gpu_visible import torch_ordinals
from agent.nvml import Nvml
from agent.settings import DeviceRequest
from contracts.errors import FailedPrecondition
from contracts.registration import DeviceReport

log = logging.getLogger(__name__)

CPU_RAM_SHARE = 0.8  # of the node's memory, split evenly over declared CPU slots
GIB = 1024**3


def detect_devices(request: DeviceRequest) -> list[DeviceReport]:
    """The devices this node offers, each with a measured TFLOPS figure."""
    if request.kind == "cpu":
        memory = CPU_RAM_SHARE * system_memory_bytes() / request.count / GIB
        tflops = measure_cpu_tflops()
        return [
            DeviceReport(index=i, model="cpu", memory_gb=round(memory, 2), measured_tflops=tflops, kind="cpu")
            for i in range(request.count)
        ]
    return detect_cuda_devices(Nvml, os.environ.get("CUDA_VISIBLE_DEVICES"))


def detect_cuda_devices(nvml: Callable[[], Nvml], cuda_visible: str | None) -> list[DeviceReport]:
    """The node's CUDA devices as NVML finds them, restricted to the inherited
    ``CUDA_VISIBLE_DEVICES``, each named by UUID with its NVLink island; a device a health rule
    cordons is not offered (the operator reads why in the log and in the node's health)."""
    import torch

    try:
        session = nvml()
    except FailedPrecondition as exc:
        raise FailedPrecondition(
            f"--devices auto: {exc.message}; declare CPU slots with --devices cpu:N"
        ) from exc
    try:
        reading = parse_reading(session.read())
    finally:
        session.close()
    found = offer(reading, cuda_visible)
    for v in found.verdicts:
        log.warning("GPU health: %s", v.reason)
    if found.node_reason:
        raise FailedPrecondition(f"GPU health cordons this node: {found.node_reason}")
    units = list(found.units)
    if not units:
        raise FailedPrecondition(
            "--devices auto found no healthy CUDA device; declare CPU slots with --devices cpu:N"
        )
    torch_uuids = [str(torch.cuda.get_device_properties(i).uuid) for i in range(torch.cuda.device_count())]
    ordinals = torch_ordinals(units, torch_uuids)
    islands = found.islands
    return [
        DeviceReport(
            index=i,
            model=u.name,
            memory_gb=u.memory_gb,
            measured_tflops=measure_cuda_tflops(ordinal),
            kind="cuda",
            uuid=u.uuid,
            link_group=island,
            bus_index=u.gpu.index,
        )
        for i, (u, ordinal, island) in enumerate(zip(units, ordinals, islands, strict=True))
    ]


def system_memory_bytes() -> int:
    """Physical memory, or the cgroup limit when a container sets a lower one."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def measure_cpu_tflops(n: int = 256, budget_s: float = 0.25) -> float:
    """Single-thread fp32 matmul throughput; about ``budget_s`` seconds."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = torch.randn(n, n), torch.randn(n, n)
        for _ in range(3):
            a @ b
        iters, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < budget_s:
            a @ b
            iters += 1
    finally:
        torch.set_num_threads(threads)
    return round(2 * n**3 * iters / elapsed / 1e12, 6)


def measure_cuda_tflops(index: int, n: int = 8192, budget_s: float = 0.3) -> float:
    """Dense matmul throughput of one CUDA device, in its fastest common dtype."""
    import torch

    device = torch.device("cuda", index)
    dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    with torch.cuda.device(device):
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        for _ in range(3):
            a @ b
        torch.cuda.synchronize(device)
        iters, start = 0, time.perf_counter()
        while time.perf_counter() - start < budget_s:
            for _ in range(5):
                a @ b
            iters += 5
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - start
        del a, b
        torch.cuda.empty_cache()
    tflops = 2 * n**3 * iters / elapsed / 1e12
    log.info(
        "cuda:%d %s: %.1f TFLOPS (%s matmul %d)", index, torch.cuda.get_device_name(index), tflops, dtype, n
    )
    return round(tflops, 3)
