"""Which resources a message between two devices crosses, and its latency.

The snapshot knows a cluster's fabric (``intra_bandwidth_gbps``, ``intra_latency_ms``) and links
between regions (``ResourceSnapshot.link``; a region's own clusters talk over its local link).
The simulator reads that as:

- every device has one port into its node's interconnect and one into the cluster fabric, each at
  the cluster's intra bandwidth in each direction (rail-optimised GPU servers give each device its
  own NIC, e.g. eight 400 Gb/s ConnectX-7 for eight H100 in a DGX H100; NVLink is separate from
  the NIC). A node that declares its own figures (``NodeInfo.fabric_bandwidth_gbps``,
  ``fabric_latency_ms``) has fabric ports at the lower of its rate and the cluster's, and a message
  between two nodes pays the larger of the latencies of the cluster and of both nodes. The node
  interconnect runs at the cluster's rate; the fabric itself is non-blocking (fat tree), so only
  the ports can be full;
- traffic between clusters leaves through the sender's fabric port and crosses the link between
  the two regions, whose latency it pays: one pipe per direction (Ethernet and InfiniBand links
  are full duplex; the snapshot keeps a figure per direction, a lone direction serving both).
  Two clusters of one region meet over the region's local link, read as each cluster's port into
  the region's network, one pipe out and one in at the local link's rate (full duplex too): a
  cluster's traffic to all its in-region peers shares its port, two clusters' opposite flows do
  not share anything;
- goodput factors scale nominal bandwidth to what a transport achieves (1.0: the wire rate).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from control_layer.planner.snapshot import ResourceSnapshot

GBPS = 1e9 / 8  # bytes/s per Gb/s


@dataclass(frozen=True, order=True)
class Device:
    cluster: str
    node: str
    index: int


@dataclass
class Topology:
    snapshot: ResourceSnapshot
    lan_goodput: float = 1.0
    wan_goodput: float = 1.0
    capacity: dict[object, float] = field(default_factory=dict)
    _region: dict[str, str] = field(default_factory=dict)
    _fabric: dict[str, tuple[float, float]] = field(default_factory=dict)
    _nic: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for c in self.snapshot.clusters:
            self._region[c.id] = c.region
            rate, latency = c.intra_bandwidth_gbps * GBPS * self.lan_goodput, c.intra_latency_ms / 1e3
            self._fabric[c.id] = (rate, latency)
            for n in c.nodes:
                own_rate = rate
                if n.fabric_bandwidth_gbps is not None:
                    own_rate = min(rate, n.fabric_bandwidth_gbps * GBPS * self.lan_goodput)
                own_latency = latency
                if n.fabric_latency_ms is not None:
                    own_latency = max(latency, n.fabric_latency_ms / 1e3)
                self._nic[(c.id, n.id)] = (own_rate, own_latency)

    def region(self, cluster: str) -> str:
        return self._region[cluster]

    def _port(self, key: tuple, rate: float) -> tuple:
        self.capacity.setdefault(key, rate)
        return key

    def route(self, a: object, b: object) -> tuple[tuple[object, ...], float, str]:
        """(resources, latency s, link label) for a message from device a to device b."""
        assert isinstance(a, Device) and isinstance(b, Device)
        if a.cluster == b.cluster:
            if a.node == b.node:
                rate, latency = self._fabric[a.cluster]
                path = (self._port(("node", "out", a), rate), self._port(("node", "in", b), rate))
                return path, latency, f"node:{a.cluster}/{a.node}"
            (rate_a, lat_a), (rate_b, lat_b) = self._nic[(a.cluster, a.node)], self._nic[(b.cluster, b.node)]
            path = (self._port(("nic", "out", a), rate_a), self._port(("nic", "in", b), rate_b))
            return path, max(lat_a, lat_b), f"fabric:{a.cluster}"
        ra, rb = self._region[a.cluster], self._region[b.cluster]
        link = self.snapshot.link(ra, rb)
        if link is None:
            raise ValueError(f"no link between regions {ra!r} and {rb!r}")
        goodput = self.lan_goodput if ra == rb else self.wan_goodput
        out_rate, _ = self._nic[(a.cluster, a.node)]
        in_rate, _ = self._nic[(b.cluster, b.node)]
        rate = link.bandwidth_gbps * GBPS * goodput
        if ra == rb:
            between = (
                self._port(("local", "out", a.cluster), rate),
                self._port(("local", "in", b.cluster), rate),
            )
        else:
            between = (self._port(("link", ra, rb), rate),)
        path = (self._port(("nic", "out", a), out_rate), *between, self._port(("nic", "in", b), in_rate))
        return path, link.latency_ms / 1e3, f"link:{ra}->{rb}"
