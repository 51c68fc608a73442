"""A full mesh of kernel-shaped links between network namespaces: a rate for every pair of nodes.

    node n0 ── veth (tbf r01 both ends) ── node n1
      │  ╲______ veth (tbf r02) ______      │
      │                               ╲     │
    veth (tbf r03)                     node n2 ...

``netlab.py`` shapes each region's one veth (a node's NIC: every peer behind the same rate);
here every pair of nodes has its own veth pair, shaped by tc tbf on both ends at that pair's rate,
as links between regions are: the control plane's snapshot holds a link per pair of regions, and
its probes measure each one. Each node's address (a /32) sits on its first veth
(``node_dev``; this kernel has no dummy interfaces) and reaches every peer's address over their
own veth (a host route with that source), so a process that binds the node's address (gloo with
``GLOO_SOCKET_IFNAME=node_dev``, gRPC servers) talks to each peer over the pair's link. Every
veth carries one TCP segment per packet, as in ``netlab.py``. No latency is emulated (netem is
absent here). Needs root; everything is removed on exit.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.netlab import _frames, _ip, _tc
from contracts.lifetime import PARENT_ENV, keeper_command, tied_env


def pair(a: int, b: int) -> tuple[int, int]:
    return (a, b) if a < b else (b, a)


@dataclass
class MeshLab:
    """``with MeshLab(3, {(0, 1): 5, (0, 2): 20, (1, 2): 100}) as lab: lab.popen(0, [...])``."""

    nodes: int
    rates_mbit: Mapping[tuple[int, int], float]
    prefix: str
    subnet: str
    namespaces: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 2 <= self.nodes <= 16:
            raise ValueError(f"a mesh holds 2 to 16 nodes, got {self.nodes}")
        want = {(a, b) for a in range(self.nodes) for b in range(a + 1, self.nodes)}
        if set(self.rates_mbit) != want:
            raise ValueError(f"rates_mbit must name every pair (a, b) with a < b: {sorted(want)}")
        bad = {p: r for p, r in self.rates_mbit.items() if not 0.1 <= r <= 10_000}
        if bad:
            raise ValueError(f"rates must be 0.1 to 10,000 Mbit/s: {bad}")
        if len(self.prefix) > 8:
            raise ValueError("prefix: at most 8 characters (interface names hold 15)")

    def ip(self, node: int) -> str:
        return f"{self.subnet}.{node + 1}"

    def node_dev(self, node: int) -> str:
        """The veth holding the node's address: the one toward its first peer."""
        peer = 1 if node == 0 else 0
        return f"{self.prefix}{node}x{peer}"

    def ns(self, node: int) -> str:
        return f"{self.prefix}-n{node}"

    def __enter__(self) -> MeshLab:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _build(self) -> None:
        for i in range(self.nodes):
            ns = self.ns(i)
            _ip("netns", "add", ns)
            self.namespaces.append(ns)
            _ip("link", "set", "lo", "up", ns=ns)
        for (a, b), rate in sorted(self.rates_mbit.items()):
            da, db = f"{self.prefix}{a}x{b}", f"{self.prefix}{b}x{a}"
            _ip("link", "add", da, "type", "veth", "peer", "name", db)
            _frames(da, db)
            for node, dev, peer in ((a, da, b), (b, db, a)):
                ns = self.ns(node)
                _ip("link", "set", dev, "netns", ns)
                if dev == self.node_dev(node):
                    _ip("addr", "add", f"{self.ip(node)}/32", "dev", dev, ns=ns)
                _ip("link", "set", dev, "up", ns=ns)
                _ip("route", "add", f"{self.ip(peer)}/32", "dev", dev, "src", self.ip(node), ns=ns)
                _shape(ns, dev, rate)

    def close(self) -> None:
        for ns in self.namespaces:
            _ip("netns", "del", ns, check=False)  # takes its veths (and their peers) with it
        self.namespaces.clear()

    def command(self, node: int, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns(node), *argv]

    def popen(
        self, node: int, argv: Sequence[str], log: Path, env: Mapping[str, str], cwd: Path
    ) -> subprocess.Popen[bytes]:
        """``argv`` in ``node``'s namespace, in its own session, tied to this process
        (``contracts.lifetime``): it dies with the benchmark."""
        out = open(log, "wb")  # noqa: SIM115 - the child owns it
        return subprocess.Popen(
            self.command(node, argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=tied_env(dict(env)),
            cwd=cwd,
        )

    def popen_kept(
        self,
        node: int,
        argv: Sequence[str],
        log: Path,
        env: Mapping[str, str],
        cwd: Path,
        grace_s: float = 5.0,
    ) -> subprocess.Popen[bytes]:
        """``argv`` in ``node``'s namespace under a keeper, as the agent launches a task's torchrun
        (``agent.launchers.LocalLauncher``): the tree ends with this process or at a SIGTERM."""
        kept, fds = keeper_command(self.command(node, argv), grace_s=grace_s)
        out = open(log, "wb")  # noqa: SIM115 - the child owns it
        return subprocess.Popen(
            kept,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={k: v for k, v in env.items() if k != PARENT_ENV},
            cwd=cwd,
            pass_fds=fds,
        )

    def describe(self) -> str:
        rates = ", ".join(f"n{a}-n{b} {r:g}" for (a, b), r in sorted(self.rates_mbit.items()))
        return f"{self.nodes} namespaces, a tbf-shaped veth per pair (Mbit/s): {rates}"


def _shape(ns: str, dev: str, rate_mbit: float) -> None:
    """tbf at ``rate_mbit`` with a bucket of one timer tick of traffic (HZ=250), at least 4 KiB:
    ``netlab``'s 64 KiB bucket lets half of a 128 KiB message through at line rate on a 6 Mbit/s
    link once the link has idled for ~90 ms, as a pipeline's messages do between micro-batches,
    so such a link carried pipeline messages well above the rate its probe measured."""
    burst = max(4096, int(rate_mbit * 1e6 / 8 / 250))
    _tc("qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{rate_mbit}mbit", "burst", str(burst),
        "latency", "50ms", ns=ns)  # fmt: skip
