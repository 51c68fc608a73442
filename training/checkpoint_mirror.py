"""Checkpoints of a torchrun group spanning nodes, whole on every node of the group.

DCP writes each rank's shards where the rank runs, and the coordinator's ``.metadata`` (with the
leader's ``meta.pt``) on the first node only. Without a disk the nodes share, no node would hold a
checkpoint it could resume from, and the shards written on a node would be lost with it. So after
each save the nodes' heads (each node's lowest rank) exchange what their node wrote, file by file,
and every head marks its node's copy ``COMPLETE`` only once it holds every file. A node lost later
leaves its shards on the others: the re-placed group resumes from a survivor's copy, and a node
new to the group fetches that copy first (the agents' checkpoint copies, ``control_layer.
checkpoint_copies``). Where that fetch failed or came short (the control plane's record lags the
nodes, which prune old steps), the group's start sends the newest checkpoint a node holds to the
nodes lacking it (``share``), so the group never starts over for want of a copy. The price: every
node writes the whole checkpoint, and each file crosses the group's network once per other node.
On a shared disk the exchange rewrites identical files.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist

CHUNK_BYTES = 64 * 1024 * 1024  # a file crosses in pieces this large (bounds each rank's memory)
_PART = ".mirror-part"  # a file being received; never listed, never resumed from


@dataclass(frozen=True)
class NodeLayout:
    """Which node each rank runs on, and the process group of the nodes' heads."""

    node_of: tuple[int, ...]  # global rank -> node rank
    heads: tuple[int, ...]  # the lowest rank of each node, in node order
    heads_group: dist.ProcessGroup

    def is_head(self, rank: int) -> bool:
        return rank in self.heads


def node_layout(group: dist.ProcessGroup) -> NodeLayout | None:
    """Collective over ``group``, which holds every rank (and, for the heads' group, over the
    default group). None when every rank runs on one node. A node is torchrun's ``GROUP_RANK``."""
    node = int(os.environ.get("GROUP_RANK", "0"))
    nodes: list[int | None] = [None] * dist.get_world_size()
    dist.all_gather_object(nodes, node, group=group)
    node_of = tuple(int(n) for n in nodes if n is not None)
    if len(set(node_of)) == 1:
        return None
    heads = tuple(sorted(node_of.index(n) for n in set(node_of)))
    return NodeLayout(node_of, heads, dist.new_group(ranks=list(heads), backend="gloo"))


def _files(path: Path) -> list[tuple[str, int]]:
    return sorted(
        (p.name, p.stat().st_size) for p in path.iterdir() if p.is_file() and not p.name.endswith(_PART)
    )


def _send_or_receive(value: object, src: int, group: dist.ProcessGroup) -> object:
    box = [value]
    dist.broadcast_object_list(box, src=src, group=group)
    return box[0]


def _from_head(path: Path, head: int, layout: NodeLayout, receive: bool) -> int:
    """Heads only, collective over the heads' group: head ``head`` sends every file under ``path``;
    the others write them when ``receive`` (each under a temporary name, renamed whole). Returns
    the bytes this head wrote."""
    me, received = dist.get_rank(), 0
    listing = _send_or_receive(_files(path) if me == head else None, head, layout.heads_group)
    for name, size in listing:  # type: ignore[union-attr]
        part = path / f"{name}.{layout.node_of[me]}{_PART}"
        writes = me != head and receive
        with open(path / name, "rb") if me == head else open(part if writes else os.devnull, "wb") as f:
            for _ in range(0, max(size, 1), CHUNK_BYTES):
                chunk = f.read(CHUNK_BYTES) if me == head else None  # type: ignore[union-attr]
                chunk = _send_or_receive(chunk, head, layout.heads_group)
                if writes:
                    f.write(chunk)  # type: ignore[arg-type]
                    received += len(chunk)  # type: ignore[arg-type]
        if writes:
            os.replace(part, path / name)
    return received


def mirror(path: Path, layout: NodeLayout) -> int:
    """Heads only, collective over the heads' group: every head ends with every file any head's
    node wrote under ``path``. Returns the bytes this head received."""
    return sum(_from_head(path, head, layout, receive=True) for head in layout.heads)


def share(path: Path, source: int, lacking: bool, layout: NodeLayout) -> int:
    """Heads only, collective over the heads' group: a checkpoint directory head ``source``'s node
    holds whole, sent to the heads whose node is ``lacking`` it (anything there under that name,
    an interrupted save or copy, is dropped first). The caller marks the received copy complete.
    Returns the bytes this head received."""
    if lacking:
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
    return _from_head(path, source, layout, receive=lacking)
