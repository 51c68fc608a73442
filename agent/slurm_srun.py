"""A task spread over several nodes of a Slurm cluster: one ``srun`` step that starts one torchrun
per node, meeting at the first node of the job's node list.

Pure: the batch script and the ``sbatch`` options from the worker command the local backend would
run (``training.launch --standalone``: torchrun), the number of nodes and the processes per node. The
node rank is each srun task's ``SLURM_NODEID``; the rendezvous host is the first name of
``scontrol show hostnames $SLURM_JOB_NODELIST`` and its port derives from the job id, so two cpn
jobs sharing a node do not meet at one port.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass

TORCHRUN = "training.launch"  # torchrun as the local backend starts it (agent.workers.LAUNCHER)
RDZV_PORT_BASE, RDZV_PORT_SPAN = 20000, 20000  # ports 20000-39999, from the job id


@dataclass(frozen=True)
class NodeSplit:
    """How many nodes a task takes and how many of its processes (and slots) each runs."""

    nodes: int
    per_node: int


def split_over_nodes(slots: int, slots_per_node: int) -> NodeSplit:
    """The fewest nodes of ``slots_per_node`` slots that hold ``slots`` in equal shares (torchrun
    runs the same number of processes on every node); one node when the slots fit on one, or when
    they do not divide evenly over any number that would (Slurm then queues it for a big node)."""
    if slots_per_node <= 0 or slots <= slots_per_node:
        return NodeSplit(1, slots)
    for nodes in range(math.ceil(slots / slots_per_node), slots + 1):
        if slots % nodes == 0:
            return NodeSplit(nodes, slots // nodes)
    return NodeSplit(1, slots)


def torchrun_per_node(cmd: list[str], nodes: int, per_node: int) -> list[str]:
    """``cmd`` (``python -m training.launch --standalone --nproc-per-node N ...``) with a
    multi-node rendezvous instead: ``$SLURM_NODEID`` as the node rank, the rendezvous address
    from ``$CPN_RDZV_HOST``/``$CPN_RDZV_PORT`` (set by the batch script). Raises ValueError for a
    command that is not a standalone torchrun (only those can be spread)."""
    try:
        at = cmd.index(TORCHRUN)
    except ValueError:
        raise ValueError("only a torchrun command can run over several nodes") from None
    if at < 1 or cmd[at - 1] != "-m" or cmd[at + 1 : at + 2] != ["--standalone"]:
        raise ValueError("only a standalone torchrun can run over several nodes")
    rest = cmd[at + 2 :]
    if rest[:1] == ["--nproc-per-node"]:
        rest = rest[2:]
    rendezvous = [
        "--nnodes",
        str(nodes),
        "--node-rank",
        "$SLURM_NODEID",
        "--master-addr",
        "$CPN_RDZV_HOST",
        "--master-port",
        "$CPN_RDZV_PORT",
        "--nproc-per-node",
        str(per_node),
    ]
    return [*cmd[: at + 1], *rendezvous, *rest]


def _shell_word(word: str) -> str:
    """Quoted for sh, a ``$VAR`` left for the shell on each node to expand."""
    return f'"{word}"' if word.startswith("$") and word[1:].replace("_", "").isalnum() else shlex.quote(word)


def srun_script(cmd: list[str], split: NodeSplit) -> str:
    """The batch script: find the rendezvous, then one srun step of a torchrun per node. ``exec``
    keeps srun the batch step itself, so Slurm's signals reach it and it forwards them."""
    per_node = " ".join(_shell_word(w) for w in torchrun_per_node(cmd, split.nodes, split.per_node))
    inner = shlex.quote(f"exec {per_node}")
    return (
        "#!/bin/sh\n"
        "# One torchrun per node, meeting at the first node of the job's node list.\n"
        'CPN_RDZV_HOST=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
        f"CPN_RDZV_PORT=$(({RDZV_PORT_BASE} + SLURM_JOB_ID % {RDZV_PORT_SPAN}))\n"
        "export CPN_RDZV_HOST CPN_RDZV_PORT\n"
        f"exec srun --nodes={split.nodes} --ntasks={split.nodes} --ntasks-per-node=1 "
        f"--kill-on-bad-exit=1 sh -c {inner}\n"
    )
