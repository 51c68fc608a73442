"""The agent's backend (``--backend``): which launcher runs its tasks, and where its devices come
from. ``local``: this node's own devices, measured, and torchrun subprocesses. ``slurm``: the
cluster's slots, read from Slurm, how many of them are unavailable now (re-read on every
heartbeat), and a batch job per task."""

from __future__ import annotations

import asyncio
import logging
import time

from agent.devices import detect_devices, measure_cpu_tflops
from agent.launchers import Launcher, LocalLauncher
from agent.settings import AgentSettings
from agent.slurm import SlurmLauncher
from agent.slurm_cli import jobcomp_file
from agent.slurm_nodes import cluster_nodes, free_slots, slot_devices, unavailable_slots
from agent.slurm_queue import queue_wait_estimate, read_queue
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


async def cluster_capacity(
    settings: AgentSettings, launcher: Launcher, *, registered: int, held: int
) -> tuple[int, float] | None:
    """How many of the ``registered`` devices are not cpn's to use now (``agent.slurm_nodes``)
    and how long a task submitted now would queue (``agent.slurm_queue``, for one slot, with
    how long the cluster's jobs really run, ``agent.slurm_history``), which
    the launcher keeps for the tasks it submits; None on the local backend, whose devices are its
    own and whose tasks start at once."""
    if settings.backend != "slurm" or not isinstance(launcher, SlurmLauncher):
        return None
    nodes = await cluster_nodes(settings.slurm_partition)
    gpus = any(n.gpus for n in nodes)
    jobs = await read_queue(settings.slurm_partition, gpus=gpus)
    if launcher.jobcomp is None:
        launcher.jobcomp = await jobcomp_file()
    runtimes = await launcher.ended.refresh(launcher.jobcomp, time.monotonic())
    free = free_slots(nodes)
    wait = queue_wait_estimate(
        jobs, free=free, need=1, history=list(launcher.waits), now=time.time(), runtimes=runtimes
    )
    launcher.queue_wait_s, launcher.room_now = (
        wait,
        free >= 1 + sum(j.slots for j in jobs if j.state == "PENDING"),
    )
    return unavailable_slots(nodes, registered=registered, held=held), wait
