"""Random small fleets (at most 6 clusters) and jobs, as hypothesis strategies."""

from __future__ import annotations

from hypothesis import strategies as st

from contracts.job_spec import JobSpec
from control_layer.planner.snapshot import ResourceSnapshot

DEVICES = [("H100", 80.0, 700.0), ("A100", 40.0, 300.0), ("L4", 24.0, 120.0), ("T4", 16.0, 65.0)]
REGIONS = [("r0", "EU"), ("r1", "EU"), ("r2", "US"), ("r3", "US")]


# A node's own port into its cluster's fabric (Gb/s; None: the cluster's), where ``ports`` asks.
PORTS = [None, None, 1.25, 10.0, 400.0]


@st.composite
def snapshots(draw: st.DrawFn, max_clusters: int = 6, ports: bool = False) -> ResourceSnapshot:
    """``ports``: some nodes declare their own port (``NodeInfo.fabric_bandwidth_gbps``), slower
    or faster than the cluster's fabric."""
    n_regions = draw(st.integers(1, 4))
    regions = REGIONS[:n_regions]
    clusters = []
    for i in range(draw(st.integers(1, max_clusters))):
        model, mem, tflops = draw(st.sampled_from(DEVICES))
        nodes = []
        for j in range(draw(st.integers(1, 2))):
            per = draw(st.sampled_from([1, 2, 4, 8]))
            busy = draw(st.integers(0, per - 1))
            nodes.append(
                {
                    "id": f"c{i}n{j}",
                    "devices": [
                        {"index": k, "model": model, "memory_gb": mem, "tflops": tflops, "free": k >= busy}
                        for k in range(per)
                    ],
                    "alive": draw(st.booleans()) or j == 0,
                    "fabric_bandwidth_gbps": draw(st.sampled_from(PORTS)) if ports else None,
                }
            )
        price = draw(st.sampled_from([0.5, 1.0, 2.0, 3.5]))
        clusters.append(
            {
                "id": f"c{i}",
                "name": f"c{i}",
                "provider": "p",
                "region": draw(st.sampled_from(regions))[0],
                "nodes": nodes,
                "intra_bandwidth_gbps": draw(st.sampled_from([25.0, 100.0, 400.0])),
                "price_per_device_hour": price,
                "spot_price_per_device_hour": draw(st.sampled_from([None, price * 0.5])),
            }
        )
    # Identical twins (same everything but the id) exercise the aggregation of clusters into classes.
    for i in range(draw(st.integers(0, max(0, max_clusters - len(clusters))))):
        twin = dict(draw(st.sampled_from(clusters)))
        cid = f"t{i}"
        twin["id"] = twin["name"] = cid
        twin["nodes"] = [{**n, "id": f"{cid}{n['id']}"} for n in twin["nodes"]]
        clusters.append(twin)
    links = []
    for a in range(n_regions):
        for b in range(a + 1, n_regions):
            if draw(st.integers(0, 9)) < 9:
                links.append(
                    {
                        "src": regions[a][0],
                        "dst": regions[b][0],
                        "bandwidth_gbps": draw(st.sampled_from([1.0, 5.0, 25.0, 100.0])),
                        "latency_ms": draw(st.sampled_from([2.0, 20.0, 80.0])),
                        "egress_price_per_gb": draw(st.sampled_from([0.0, 0.02, 0.09])),
                    }
                )
    return ResourceSnapshot.model_validate(
        {
            "regions": [{"name": n, "jurisdiction": j} for n, j in regions],
            "clusters": clusters,
            "links": links,
        }
    )


@st.composite
def jobs(draw: st.DrawFn, with_qos: bool = True) -> JobSpec:
    seq = draw(st.sampled_from([256, 1024]))
    qos: dict = {"objective": draw(st.sampled_from(["cost", "time"]))}
    if with_qos:
        if draw(st.booleans()):
            qos["max_hours"] = draw(st.sampled_from([0.05, 0.5, 5.0, 50.0]))
        if draw(st.booleans()):
            qos["max_cost"] = draw(st.sampled_from([0.5, 5.0, 50.0, 500.0]))
        if draw(st.integers(0, 3)) == 0:
            qos["regions"] = draw(st.lists(st.sampled_from([r for r, _ in REGIONS]), min_size=1, unique=True))
        if draw(st.integers(0, 3)) == 0:
            qos["exclude_regions"] = [draw(st.sampled_from([r for r, _ in REGIONS]))]
        if draw(st.integers(0, 3)) == 0:
            qos["data_residency"] = draw(st.sampled_from(["EU", "US"]))
        if draw(st.integers(0, 3)) == 0:
            qos["accelerators"] = draw(
                st.lists(st.sampled_from(["h100", "A100", "L4", "T4"]), min_size=1, unique=True)
            )
        if draw(st.integers(0, 3)) == 0:
            qos["min_gpu_mem_gb"] = draw(st.sampled_from([20.0, 40.0]))
        qos["preemptible"] = draw(st.booleans())
    return JobSpec.model_validate(
        {
            "name": "t",
            "model": {
                "n_layers": draw(st.sampled_from([2, 4])),
                "d_model": draw(st.sampled_from([512, 2048, 4096])),
                "n_heads": 8,
                "vocab": draw(st.sampled_from([8192, 50304])),
                "seq_len": seq,
            },
            "training": {
                "steps": draw(st.sampled_from([100, 1000, 10000])),
                "global_batch_tokens": seq * draw(st.sampled_from([1, 2, 4, 8, 16])),
                "precision": draw(st.sampled_from(["auto", "bf16", "fp32"])),
            },
            "parallelism": draw(
                st.sampled_from(["auto", "auto", {"pp_schedule": "gpipe"}, {"zero": 0}, {"tp": 1}])
            ),
            "sync": {
                "mode": draw(st.sampled_from(["sync", "ssp", "local_sgd", "diloco", "async", "gossip"])),
                "every": draw(st.sampled_from([1, 10, 100])),
                "compression": draw(st.sampled_from(["none", "bf16", "int8", "topk"])),
                "staleness": draw(st.sampled_from([0, 2])),
                "gossip_peers": draw(st.sampled_from([1, 2])),
            },
            "qos": qos,
        }
    )
