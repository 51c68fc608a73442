"""The workload the WAN benchmarks train (``sync_quality.py``, ``wan_job.py``): one definition, so
their figures compare. A 4-layer GPT of 1,339,840 parameters on synthetic Markov data, 8 x 128 =
1,024 tokens per region per step, AdamW lr 1e-3 (warmup 10, cosine), three regions joined by
100 Mbit/s links."""

from __future__ import annotations

REGIONS = ["ap-south", "eu-west", "us-east"]
MODEL = {"n_layers": 4, "d_model": 160, "n_heads": 4, "vocab": 256, "seq_len": 128}
QUICK_MODEL = {"n_layers": 2, "d_model": 32, "n_heads": 4, "vocab": 32, "seq_len": 32}
DATA = {"kind": "synthetic-markov", "seed": 3}
BATCH, QUICK_BATCH = 8, 4  # sequences per region per step
LR, WARMUP, SEED = 1e-3, 10, 7
LINK_MBIT = 100.0  # tc tbf rate on both ends of every link
