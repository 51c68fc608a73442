"""Snapshots with devices freed: whether a job could ever fit, or would fit if some jobs stopped.

Pure: a new snapshot whose nodes (only those that change) are copies; the planner then answers on
it as on any other.
"""

from __future__ import annotations

from collections.abc import Collection

from control_layer.planner.snapshot import ClusterInfo, NodeInfo, ResourceSnapshot

DeviceKey = tuple[str, int]  # (node id, device index)


def with_devices_free(
    snapshot: ResourceSnapshot, devices: Collection[DeviceKey] | None = None
) -> ResourceSnapshot:
    """``snapshot`` with ``devices`` free as well (every device, and no scheduler's queue, when
    None): the fleet as registered, or as it would be once the named devices are released."""
    clusters: list[ClusterInfo] = []
    for cluster in snapshot.clusters:
        nodes = [_freed(node, devices) for node in cluster.nodes]
        if all(new is old for new, old in zip(nodes, cluster.nodes, strict=True)):
            clusters.append(cluster)
        else:
            clusters.append(cluster.model_copy(update={"nodes": nodes}))
    return ResourceSnapshot.model_construct(
        regions=list(snapshot.regions),
        clusters=clusters,
        links=list(snapshot.links),
        taken_at=snapshot.taken_at,
    )


def _freed(node: NodeInfo, devices: Collection[DeviceKey] | None) -> NodeInfo:
    if devices is None and node.queue_wait_s > 0:
        # The fleet as registered: a scheduler's queue passes, as other users' jobs end.
        node = node.model_copy(update={"queue_wait_s": 0.0})
    if all(d.free or (devices is not None and (node.id, d.index) not in devices) for d in node.devices):
        return node
    return node.model_copy(
        update={
            "devices": [
                d.model_copy(update={"free": True})
                if not d.free and (devices is None or (node.id, d.index) in devices)
                else d
                for d in node.devices
            ]
        }
    )
