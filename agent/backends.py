"""The agent's backend (``--backend``): which launcher runs its tasks, and where its devices come
from. ``local``: this node's own devices, measured, and torchrun subprocesses. ``slurm``: the
cluster's slots, read from Slurm, how many of them are unavailable now (re-read on every
heartbeat), and a batch job per task."""

from __future__ import annotations

import asyncio
import logging

from agent.devices import detect_devices, measure_cpu_tflops
from agent.launchers import Launcher, LocalLauncher
from agent.settings import AgentSettings
from agent.slurm import SlurmLauncher
from agent.slurm_nodes import cluster_nodes, free_slots, slot_devices, unavailable_slots
from contracts.registration import DeviceReport

log = logging.getLogger(__name__)


def make_launcher(settings: AgentSettings) -> Launcher:
    if settings.backend == "slurm":
        return SlurmLauncher(
            partition=settings.slurm_partition,
            account=settings.slurm_account,
            poll_s=settings.slurm_poll_s,
            srun=settings.slurm_srun,
        )
    return LocalLauncher()


async def find_devices(settings: AgentSettings) -> list[DeviceReport]:
    """What the agent registers. A Slurm cluster's CPU slots take the figure of a CPU of the
    agent's node (its compute nodes are not the agent's to measure); its GPUs, the declared one."""
    if settings.backend != "slurm":
        return await asyncio.to_thread(detect_devices, settings.devices)
    nodes = await cluster_nodes(settings.slurm_partition)
    if not nodes:
        where = f"partition {settings.slurm_partition!r}" if settings.slurm_partition else "the cluster"
        raise RuntimeError(f"Slurm lists no node in {where}")
    cpu_tflops = await asyncio.to_thread(measure_cpu_tflops)
    devices = slot_devices(
        nodes,
        cpu_tflops=cpu_tflops,
        gpu_memory_gb=settings.slurm_gpu_memory_gb,
        gpu_tflops=settings.slurm_gpu_tflops,
    )
    log.info(
        "Slurm: %d node(s) (%s), %d %s slot(s), %d free now",
        len(nodes),
        ", ".join(n.name for n in nodes),
        len(devices),
        devices[0].kind if devices else "-",
        free_slots(nodes),
    )
    return devices


async def devices_unavailable(settings: AgentSettings, *, registered: int, held: int) -> int | None:
    """How many of the ``registered`` devices are not cpn's to use now (``agent.slurm_nodes``);
    None on the local backend, whose devices are its own."""
    if settings.backend != "slurm":
        return None
    nodes = await cluster_nodes(settings.slurm_partition)
    return unavailable_slots(nodes, registered=registered, held=held)
