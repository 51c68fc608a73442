"""Generated fleets and jobs for the planner benchmark (seeded, so every run sees the same inputs)."""

from __future__ import annotations

import numpy as np

from contracts.job_spec import JobSpec
from control_layer.planner.snapshot import LOCAL_BANDWIDTH_GBPS, LOCAL_LATENCY_MS, ResourceSnapshot

# (continent, jurisdiction, regions)
CONTINENTS = [
    ("eu", "EU", 8),
    ("us", "US", 8),
    ("ap", "APAC", 6),
    ("cn", "CN", 4),
    ("sa", "SA", 2),
    ("af", "AF", 2),
]
# model, memory GB, measured dense bf16 TFLOPS, on-demand USD per device-hour (list price), fabric Gbps
DEVICES = [
    ("NVIDIA H100 80GB HBM3", 80.0, 700.0, 3.2, 400.0),
    ("NVIDIA A100-SXM4-80GB", 80.0, 290.0, 1.9, 200.0),
    ("NVIDIA A100-SXM4-40GB", 40.0, 280.0, 1.4, 200.0),
    ("NVIDIA L40S", 48.0, 330.0, 1.1, 100.0),
    ("NVIDIA L4", 24.0, 110.0, 0.6, 50.0),
    ("Tesla V100-SXM2-32GB", 32.0, 110.0, 0.7, 100.0),
]
PROVIDERS = 8
NODE_COUNTS = [1, 2, 4, 8, 16, 32]


def regions() -> list[tuple[str, str, str]]:
    """(name, continent, jurisdiction) for the 30 regions."""
    out = []
    for cont, jur, n in CONTINENTS:
        out += [(f"{cont}-{i}", cont, jur) for i in range(n)]
    return out


def fleet(n_clusters: int, seed: int = 0, max_devices: int = 100_000) -> ResourceSnapshot:
    """n_clusters clusters over 30 regions; at most max_devices devices in all.

    Providers price a device model from a few tiers and a region surcharge, so clusters repeat in
    kind the way real catalogues do; nodes are 8-device servers, some of them busy.
    """
    rng = np.random.default_rng(seed)
    regs = regions()
    surcharge = {name: float(rng.choice([0.9, 1.0, 1.1, 1.25])) for name, _, _ in regs}
    tier = rng.choice([0.8, 0.9, 1.0, 1.15], size=(PROVIDERS, len(DEVICES)))
    budget = max_devices // 8
    sizes = rng.choice(NODE_COUNTS, size=n_clusters, p=[0.25, 0.25, 0.2, 0.15, 0.1, 0.05])
    # Scale node counts down if the fleet would exceed max_devices.
    if sizes.sum() > budget:
        sizes = np.maximum(1, (sizes * budget // sizes.sum()).astype(int))
    clusters = []
    for i in range(n_clusters):
        name, _, _ = regs[int(rng.integers(len(regs)))]
        prov = int(rng.integers(PROVIDERS))
        d = int(rng.choice(len(DEVICES), p=[0.25, 0.2, 0.15, 0.15, 0.15, 0.1]))
        model, mem, tflops, price, fabric = DEVICES[d]
        price = round(price * float(tier[prov, d]) * surcharge[name], 2)
        busy_nodes = int(rng.integers(0, max(1, int(sizes[i]) // 2) + 1)) if rng.random() < 0.5 else 0
        nodes = []
        for j in range(int(sizes[i])):
            free = j >= busy_nodes
            nodes.append(
                {
                    "id": f"c{i}-n{j}",
                    "devices": [
                        {"index": k, "model": model, "memory_gb": mem, "tflops": tflops, "free": free}
                        for k in range(8)
                    ],
                }
            )
        clusters.append(
            {
                "id": f"c{i:04d}",
                "name": f"{name}-p{prov}-{i}",
                "provider": f"p{prov}",
                "region": name,
                "nodes": nodes,
                "intra_bandwidth_gbps": fabric,
                "price_per_device_hour": price,
                "spot_price_per_device_hour": round(price * 0.45, 2) if rng.random() < 0.5 else None,
            }
        )
    links = []
    for a in range(len(regs)):
        for b in range(a + 1, len(regs)):
            same = regs[a][1] == regs[b][1]
            links.append(
                {
                    "src": regs[a][0],
                    "dst": regs[b][0],
                    "bandwidth_gbps": float(rng.choice([25.0, 50.0, 100.0] if same else [2.0, 5.0, 10.0])),
                    "latency_ms": float(rng.choice([5.0, 10.0, 20.0] if same else [80.0, 150.0, 250.0])),
                    "egress_price_per_gb": float(rng.choice([0.01, 0.02] if same else [0.05, 0.08, 0.12])),
                }
            )
    return ResourceSnapshot.model_validate(
        {
            "regions": [{"name": n, "jurisdiction": j} for n, _, j in regs],
            "clusters": clusters,
            "links": links,
        }
    )


# name, n_layers, d_model, n_heads, seq_len, global batch tokens, steps
MODELS = [
    ("gpt-125m", 12, 768, 12, 1024, 524_288, 20_000),
    ("gpt-1.3b", 24, 2048, 16, 2048, 1_048_576, 20_000),
    ("gpt-7b", 32, 4096, 32, 4096, 4_194_304, 10_000),
    ("gpt-13b", 40, 5120, 40, 4096, 4_194_304, 10_000),
    ("gpt-70b", 80, 8192, 64, 4096, 4_194_304, 5_000),
]


def job(model: int, rng: np.random.Generator, regions_allowed: list[str] | None = None) -> JobSpec:
    name, layers, d, heads, seq, batch, steps = MODELS[model]
    qos: dict = {"objective": str(rng.choice(["cost", "time"]))}
    if rng.random() < 0.5:
        qos["preemptible"] = True
    if regions_allowed is not None:
        qos["regions"] = regions_allowed
    elif rng.random() < 0.3:
        qos["data_residency"] = str(rng.choice(["EU", "US"]))
    if rng.random() < 0.3:
        qos["accelerators"] = ["H100", "A100"]
    return JobSpec.model_validate(
        {
            "name": name,
            "model": {"n_layers": layers, "d_model": d, "n_heads": heads, "vocab": 50304, "seq_len": seq},
            "training": {
                "steps": steps,
                "global_batch_tokens": batch,
                "micro_batch_size": 1,
                # Billion-parameter models train with activation recomputation, as in practice.
                "activation_checkpointing": layers * d * d * 12 > 2e9,
            },
            "sync": {
                "mode": str(rng.choice(["diloco", "diloco", "sync", "local_sgd", "gossip"])),
                "every": int(rng.choice([50, 100, 500])),
                "compression": str(rng.choice(["none", "bf16", "int8"])),
            },
            "qos": qos,
        }
    )


def _meshed(
    chosen: list[tuple[str, str, str]],
    clusters: list[dict],
    rng: np.random.Generator,
    bandwidths: list[float],
    latencies: list[float],
) -> ResourceSnapshot:
    """The chosen regions, their clusters, and a link between every two regions (bandwidth,
    latency and egress price drawn per pair, in that order)."""
    links = [
        {
            "src": chosen[a][0],
            "dst": chosen[b][0],
            "bandwidth_gbps": float(rng.choice(bandwidths)),
            "latency_ms": float(rng.choice(latencies)),
            "egress_price_per_gb": float(rng.choice([0.0, 0.02, 0.09])),
        }
        for a in range(len(chosen))
        for b in range(a + 1, len(chosen))
    ]
    return ResourceSnapshot.model_validate(
        {
            "regions": [{"name": n, "jurisdiction": j} for n, _, j in chosen],
            "clusters": clusters,
            "links": links,
        }
    )


def private_links(snap: ResourceSnapshot) -> ResourceSnapshot:
    """The fleet with every link declared private, each region's own network too (at the
    snapshot's default local figures, so no price moves): the planner may then span clusters
    wherever nodes declared it (a group's gloo/NCCL traffic crosses private links only)."""
    data = snap.model_dump()
    data["links"] = [{**ln, "private": True} for ln in data["links"]]
    own = {(ln["src"], ln["dst"]) for ln in data["links"] if ln["src"] == ln["dst"]}
    for r in sorted({c["region"] for c in data["clusters"]}):
        if (r, r) not in own:
            data["links"].append(
                {"src": r, "dst": r, "bandwidth_gbps": LOCAL_BANDWIDTH_GBPS, "latency_ms": LOCAL_LATENCY_MS}
                | {"private": True}
            )
    return ResourceSnapshot.model_validate(data)


def small_instance(seed: int) -> tuple[JobSpec, ResourceSnapshot]:
    """A fleet of at most 6 small clusters and a small job: exhaustive search stays cheap."""
    rng = np.random.default_rng(10_000 + seed)
    regs = regions()
    chosen = [regs[i] for i in rng.choice(len(regs), size=int(rng.integers(1, 5)), replace=False)]
    clusters = []
    for i in range(int(rng.integers(1, 7))):
        name = chosen[int(rng.integers(len(chosen)))][0]
        model, mem, tflops, price, fabric = DEVICES[int(rng.integers(len(DEVICES)))]
        nodes = [
            {
                "id": f"c{i}-n{j}",
                "devices": [
                    {"index": k, "model": model, "memory_gb": mem, "tflops": tflops}
                    for k in range(int(rng.choice([1, 2, 4])))
                ],
            }
            for j in range(int(rng.integers(1, 3)))
        ]
        clusters.append(
            {
                "id": f"c{i}",
                "region": name,
                "nodes": nodes,
                "intra_bandwidth_gbps": fabric,
                "price_per_device_hour": round(price * float(rng.choice([0.8, 1.0, 1.2])), 2),
            }
        )
    snap = _meshed(chosen, clusters, rng, bandwidths=[2.0, 10.0, 50.0], latencies=[10.0, 80.0, 200.0])
    seq = 1024
    spec = JobSpec.model_validate(
        {
            "name": "small",
            "model": {
                "n_layers": int(rng.choice([4, 8])),
                "d_model": int(rng.choice([1024, 2048, 4096])),
                "n_heads": 16,
                "vocab": 50304,
                "seq_len": seq,
            },
            "training": {
                "steps": int(rng.choice([1000, 10000])),
                "global_batch_tokens": seq * int(rng.choice([4, 8, 16])),
            },
            "sync": {
                "mode": str(rng.choice(["sync", "ssp", "local_sgd", "diloco", "async", "gossip"])),
                "every": int(rng.choice([1, 10, 100])),
                "compression": str(rng.choice(["none", "bf16", "int8", "topk"])),
            },
            "qos": {"objective": str(rng.choice(["cost", "time"]))},
        }
    )
    return spec, snap


def spanning_instance(seed: int) -> tuple[JobSpec, ResourceSnapshot]:
    """A fleet of 2 to 4 small clusters in 2 or 3 regions whose nodes (1 or 2 devices each) all
    declared their group endpoint reachable from other clusters, over links all declared private
    (``private_links``), and a job no node holds a replica
    of: its pipelines run across clusters, and across regions where one region's nodes are too
    few or dearer (``spanning``)."""
    rng = np.random.default_rng(20_000 + seed)
    regs = regions()
    chosen = [regs[i] for i in rng.choice(len(regs), size=int(rng.integers(2, 4)), replace=False)]
    model, mem, tflops, price, fabric = DEVICES[4]  # 24 GB: a 2-4B model needs several nodes
    clusters = []
    for i in range(int(rng.integers(2, 5))):
        per = int(rng.choice([1, 2]))
        clusters.append(
            {
                "id": f"c{i}",
                "region": chosen[i % len(chosen)][0],
                "nodes": [
                    {
                        "id": f"c{i}-n{j}",
                        "devices": [
                            {"index": k, "model": model, "memory_gb": mem, "tflops": tflops}
                            for k in range(per)
                        ],
                        "cross_cluster_groups": True,
                    }
                    for j in range(int(rng.integers(1, 4)))
                ],
                "intra_bandwidth_gbps": fabric,
                "price_per_device_hour": round(price * float(rng.choice([0.5, 1.0, 2.0])), 2),
            }
        )
    snap = private_links(
        _meshed(chosen, clusters, rng, bandwidths=[1.0, 10.0, 50.0], latencies=[5.0, 30.0, 100.0])
    )
    seq = 1024
    spec = JobSpec.model_validate(
        {
            "name": "spanning",
            "model": {
                "n_layers": int(rng.choice([16, 32])),
                "d_model": int(rng.choice([3072, 4096])),
                "n_heads": 16,
                "vocab": 32000,
                "seq_len": seq,
            },
            "training": {"steps": 1000, "global_batch_tokens": seq * int(rng.choice([16, 32, 64]))},
            "sync": {
                "mode": str(rng.choice(["sync", "local_sgd", "diloco"])),
                "every": int(rng.choice([1, 10, 100])),
                "compression": str(rng.choice(["none", "bf16"])),
            },
            "qos": {"objective": str(rng.choice(["cost", "time"]))},
        }
    )
    return spec, snap
