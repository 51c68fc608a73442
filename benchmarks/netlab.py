"""Kernel-shaped WAN links for benchmarks: network namespaces joined through a bridge, shaped by tc tbf.

    root ns (control plane, PostgreSQL, Redis)
      └─ veth hub ── bridge ns (Linux bridge "br0", unshaped to the root) ── veth ── region ns r0
                                                                          ├─ veth ── region ns r1
                                                                          └─ veth ── region ns r2

Every region's veth pair carries a token-bucket filter on BOTH ends (egress of the region and
egress of the bridge toward it), so a region's uplink and downlink are each ``rate_mbit`` and the
kernel, not our transport, decides how fast bytes move. Every veth carries one TCP segment per
packet (``gso_max_segs 1``), as a WAN link carries frames, so its counters count the headers of
every segment. The root namespace reaches every region
at ``hub_ip`` (unshaped), so processes in regions can talk to the control plane. Latency is NOT
emulated: netem is not available on these machines, and a delay faked in user space would not be
the kernel's.

Needs root (``ip netns``). Everything is named with a per-lab prefix and removed on exit, also
after a failure.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from contracts.lifetime import tied_env

SUBNET = "10.213.0"  # default /24, inside our own namespaces only


def _ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = ["ip", *(["-n", ns] if ns else []), *args]
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def _tc(*args: str, ns: str) -> None:
    subprocess.run(["ip", "netns", "exec", ns, "tc", *args], check=True, capture_output=True, text=True)


def netns_available() -> str | None:
    """None when namespaces can be made here, else why not."""
    name = f"cpn-probe-{os.getpid()}"
    try:
        r = _ip("netns", "add", name, check=False)
    except FileNotFoundError:
        return "the ip command is missing (iproute2)"
    if r.returncode:
        return f"ip netns add failed: {r.stderr.strip()}"
    _ip("netns", "del", name, check=False)
    return None


@dataclass
class Region:
    name: str
    ns: str
    ip: str
    dev: str  # the region's end of its veth pair (inside ns)
    bridge_dev: str  # the bridge's end (inside the bridge ns)

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this region's namespace."""
        return ["ip", "netns", "exec", self.ns, *argv]

    def counters(self) -> tuple[int, int]:
        """(tx_bytes, rx_bytes) of the region's interface, as the kernel counts them (with headers)."""
        out = subprocess.run(
            self.command(
                [
                    "cat",
                    f"/sys/class/net/{self.dev}/statistics/tx_bytes",
                    f"/sys/class/net/{self.dev}/statistics/rx_bytes",
                ]
            ),
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
        return int(out[0]), int(out[1])


@dataclass
class NetLab:
    """``with NetLab(["eu", "us", "ap"], rate_mbit=100) as lab: lab.regions["eu"].command([...])``."""

    names: Sequence[str]
    rate_mbit: float = 100.0
    prefix: str = field(default_factory=lambda: f"cpn{os.getpid() % 100000}")
    regions: dict[str, Region] = field(default_factory=dict)
    # Labs running side by side (tests, benchmarks) each need their own /24: the hub's address
    # and route live in the root namespace.
    subnet: str = SUBNET

    @property
    def hub_ip(self) -> str:
        return f"{self.subnet}.254"

    @property
    def bridge_ns(self) -> str:
        return f"{self.prefix}-br"

    def __enter__(self) -> NetLab:
        if not 1 <= len(self.names) <= 200:
            raise ValueError(f"a lab holds 1 to 200 regions, got {len(self.names)}")
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _build(self) -> None:
        br = self.bridge_ns
        _ip("netns", "add", br)
        _ip("link", "add", "br0", "type", "bridge", ns=br)
        _ip("link", "set", "br0", "up", ns=br)
        _ip("link", "set", "lo", "up", ns=br)
        # The root namespace's way in: unshaped, so the control plane is never the bottleneck.
        hub, hub_peer = f"{self.prefix}h", f"{self.prefix}hb"
        _ip("link", "add", hub, "type", "veth", "peer", "name", hub_peer)
        _frames(hub, hub_peer)
        _ip("link", "set", hub_peer, "netns", br)
        _ip("link", "set", hub_peer, "master", "br0", ns=br)
        _ip("link", "set", hub_peer, "up", ns=br)
        _ip("addr", "add", f"{self.hub_ip}/24", "dev", hub)
        _ip("link", "set", hub, "up")
        for i, name in enumerate(self.names):
            ns, dev, bdev = f"{self.prefix}-r{i}", f"{self.prefix}r{i}", f"{self.prefix}b{i}"
            region = Region(name=name, ns=ns, ip=f"{self.subnet}.{i + 1}", dev=dev, bridge_dev=bdev)
            self.regions[name] = region
            _ip("netns", "add", ns)
            _ip("link", "set", "lo", "up", ns=ns)
            _ip("link", "add", dev, "type", "veth", "peer", "name", bdev)
            _frames(dev, bdev)
            _ip("link", "set", dev, "netns", ns)
            _ip("link", "set", bdev, "netns", br)
            _ip("addr", "add", f"{region.ip}/24", "dev", dev, ns=ns)
            _ip("link", "set", dev, "up", ns=ns)
            _ip("link", "set", bdev, "master", "br0", ns=br)
            _ip("link", "set", bdev, "up", ns=br)
            _shape(ns, dev, self.rate_mbit)
            _shape(br, bdev, self.rate_mbit)

    def close(self) -> None:
        for region in self.regions.values():
            _ip("netns", "del", region.ns, check=False)
        _ip("link", "del", f"{self.prefix}h", check=False)
        _ip("netns", "del", self.bridge_ns, check=False)

    def counters(self) -> dict[str, tuple[int, int]]:
        return {name: r.counters() for name, r in self.regions.items()}

    def popen(
        self, region: str, argv: Sequence[str], log: Path | None = None, **kw: object
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside ``region``'s namespace (its own session, so it can be killed as a
        group), tied to this process: ``ip netns exec`` execs it, so an agent, a server or a worker
        of ours dies with the benchmark (``contracts.lifetime``)."""
        out = open(log, "wb") if log else subprocess.DEVNULL  # noqa: SIM115 - the child owns it
        env = tied_env(kw.pop("env", None))  # type: ignore[arg-type]
        return subprocess.Popen(  # type: ignore[call-overload]
            self.regions[region].command(argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
            **kw,
        )

    def describe(self) -> str:
        parts = [f"{n}={r.ip}" for n, r in self.regions.items()]
        return (
            f"{len(self.regions)} namespaces via bridge, tbf {self.rate_mbit:g} Mbit/s both ends: "
            + ", ".join(parts)
        )


def _frames(*devs: str) -> None:
    """One TCP segment per packet on a veth (``gso_max_segs 1``), as on a WAN link. A veth passes
    GSO buffers of several segments as one packet and counts one set of headers for them, so its
    counters would fall short of what a wire carries (66 header bytes per segment with TCP
    timestamps); the stack now segments before the device, and its counters count frames."""
    for dev in devs:
        _ip("link", "set", "dev", dev, "gso_max_segs", "1")


def _shape(ns: str, dev: str, rate_mbit: float) -> None:
    # burst must hold at least one timer tick of traffic; 64 KiB is enough up to ~1 Gbit/s at HZ=250.
    burst = max(64 * 1024, int(rate_mbit * 1e6 / 8 / 250))
    _tc(
        "qdisc",
        "replace",
        "dev",
        dev,
        "root",
        "tbf",
        "rate",
        f"{rate_mbit}mbit",
        "burst",
        str(burst),
        "latency",
        "50ms",
        ns=ns,
    )


def shell(argv: Sequence[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)
